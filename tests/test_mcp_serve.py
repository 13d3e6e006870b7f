"""`llmctl serve --mcp`: the server runs MCP tools for a request, through
the protocols' own shapes, with the official clients. Real servers: the
filesystem server from npm over stdio, and the toolbox written with the
SDK (tests/mcp_servers/toolbox.py) over stdio and over streamable HTTP on
loopback; a real model, the default Qwen2.5-Coder-1.5B."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import anthropic
import httpx
import openai
import pytest
from test_mcp import TOOLBOX, folder_with_notes, needs_fs

from conftest import wait_until
from llmctl.bench.launcher import Server, free_port

MODEL = "qwen2.5-coder-1.5b"
BETA = ["mcp-client-2025-04-04"]
QUESTION = "Which files are in the folder {}, and what does notes.txt say?"

pytestmark = [pytest.mark.slow, needs_fs]


@pytest.fixture(scope="module")
def box_http() -> Iterator[str]:
    """The toolbox over streamable HTTP on loopback: its URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(TOOLBOX), "http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"

    def up() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code < 500
        except httpx.TransportError:
            return False

    try:
        wait_until(up, "the toolbox's HTTP server", timeout=60)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def served(session_home, box_http) -> Iterator[tuple[str, Path, Path]]:
    """`llmctl serve --mcp` on the default model: (its URL, the folder the
    filesystem server reads, the toolbox's notes file). The folder's path is
    fixed: it is part of the question, and the model's greedy choice of file
    to read should not turn on pytest's run number in a temp path."""
    tmp = Path(tempfile.gettempdir()) / "llmctl-mcp-serve"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    folder, fs = folder_with_notes(tmp, allowedTools=["list_directory", "read_text_file"])
    notes = tmp / "notes.log"
    servers = json.loads(fs.read_text())["mcpServers"]
    servers["toolbox"] = {"command": sys.executable, "args": [str(TOOLBOX), "stdio"],
                          "timeout": 3, "env": {"TOOLBOX_NOTES": str(notes)}}
    servers["web"] = {"url": box_http}
    path = tmp / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    with Server.llmctl_serve(MODEL, "--ctx-size", "8192", "--max-num-seqs", "2", "--mcp",
                             str(path), env={"LLMCTL_HOME": str(session_home)}) as srv:
        srv.wait_ready(900)
        yield srv.url, folder, notes
    shutil.rmtree(tmp, ignore_errors=True)


def _openai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=900)


def _anthropic(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="none", timeout=900)


FILES = {"type": "mcp", "server_label": "files", "require_approval": "never"}


def _read_the_folder(output: list, text: str) -> None:
    """The calls listed the folder and read notes.txt, and the answer says
    what it says."""
    calls = [i for i in output if i.type == "mcp_call"]
    outputs = " ".join(c.output or "" for c in calls)
    assert "notes.txt" in outputs and "todo.md" in outputs and "oat milk" in outputs.lower()
    assert all(c.server_label == "files" and c.status == "completed" for c in calls)
    assert "oat milk" in text.lower(), text


def test_responses_runs_the_tools_whole_and_streamed(served):
    url, folder, _ = served
    client = _openai(url)
    ask = {"model": MODEL, "input": QUESTION.format(folder), "tools": [FILES],
           "temperature": 0, "max_output_tokens": 300}
    whole = client.responses.create(**ask)
    assert whole.status == "completed"
    assert whole.output[0].type == "mcp_list_tools"
    assert {t.name for t in whole.output[0].tools} == {"list_directory", "read_text_file"}
    _read_the_folder(whole.output, whole.output_text)

    kinds, final = [], None
    for event in client.responses.create(**ask, stream=True):
        kinds.append(event.type)
        if event.type == "response.completed":
            final = event.response
    assert final is not None and final.status == "completed"
    for kind in ("response.mcp_list_tools.completed", "response.mcp_call_arguments.delta",
                 "response.mcp_call.completed", "response.output_text.delta"):
        assert kind in kinds
    _read_the_folder(final.output, final.output_text)
    # The stored response continues: its conversation holds the calls.
    again = client.responses.create(model=MODEL, previous_response_id=whole.id, temperature=0,
                                    input="Answer in one word: does todo.md exist?",
                                    max_output_tokens=20)
    assert again.status == "completed" and "yes" in again.output_text.lower()


def _folder_message(blocks: list, text: str) -> None:
    uses = [b for b in blocks if b.type == "mcp_tool_use"]
    results = [b for b in blocks if b.type == "mcp_tool_result"]
    assert uses and len(results) == len(uses)
    assert {r.tool_use_id for r in results} == {u.id for u in uses}
    assert all(u.server_name == "files" for u in uses)
    outputs = " ".join(c.text for r in results for c in r.content)
    assert "notes.txt" in outputs and "oat milk" in outputs.lower()
    assert "oat milk" in text.lower(), text


def test_messages_runs_the_tools_whole_and_streamed(served):
    url, folder, _ = served
    client = _anthropic(url)
    ask = {"model": MODEL, "max_tokens": 300, "betas": BETA,
           "mcp_servers": [{"type": "url", "name": "files", "url": ""}],
           "messages": [{"role": "user", "content": QUESTION.format(folder)}],
           "extra_body": {"temperature": 0}}
    whole = client.beta.messages.create(**ask)
    assert whole.stop_reason == "end_turn"
    _folder_message(whole.content, "".join(b.text for b in whole.content if b.type == "text"))
    with client.beta.messages.stream(**ask) as stream:
        final = stream.get_final_message()
    _folder_message(final.content, "".join(b.text for b in final.content if b.type == "text"))
    # The message goes back as it came, MCP blocks and all.
    ask["messages"] += [{"role": "assistant", "content": [b.model_dump() for b in whole.content]},
                        {"role": "user", "content": "Say only: done"}]
    assert client.beta.messages.create(**{**ask, "max_tokens": 10}).content


def test_an_approval_round_trip(served):
    url, _, notes = served
    client = _openai(url)
    tool = {"type": "mcp", "server_label": "toolbox", "allowed_tools": ["note"]}
    first = client.responses.create(model=MODEL, tools=[tool], temperature=0,
                                    input="Use the note tool to note: buy milk",
                                    max_output_tokens=100)
    (asked,) = [i for i in first.output if i.type == "mcp_approval_request"]
    assert asked.name == "note" and "milk" in json.loads(asked.arguments)["text"].lower()
    assert not notes.exists()           # nothing runs before the yes
    second = client.responses.create(
        model=MODEL, tools=[tool], temperature=0, previous_response_id=first.id,
        max_output_tokens=100,
        input=[{"type": "mcp_approval_response", "approval_request_id": asked.id,
                "approve": True}])
    (ran,) = [i for i in second.output if i.type == "mcp_call"]
    assert ran.output == "noted" and "milk" in notes.read_text().lower()
    bad = httpx.post(f"{url}/v1/responses", json={
        "model": MODEL, "tools": [tool], "previous_response_id": first.id,
        "input": [{"type": "mcp_approval_response", "approval_request_id": "mcpr_nope",
                   "approve": True}]})
    assert bad.status_code == 400 and "mcpr_nope" in bad.json()["error"]["message"]


def _error_text(call) -> str:
    """The text of a failed mcp_call's error (mcp_tool_execution_error)."""
    assert call.error is not None and call.error.type == "mcp_tool_execution_error"
    return " ".join(part["text"] for part in call.error.content)


def _forced(client: openai.OpenAI, label: str, tool: str, ask: str):
    return client.responses.create(
        model=MODEL, temperature=0, max_output_tokens=120, input=ask, tool_choice="required",
        tools=[{"type": "mcp", "server_label": label, "allowed_tools": [tool],
                "require_approval": "never"}])


def test_a_hanging_tool_is_cut_off_and_a_crash_leaves_the_server_well(served):
    url, _, _ = served
    client = _openai(url)
    hung = _forced(client, "toolbox", "hang", "Call hang with seconds set to 60.")
    (call,) = [i for i in hung.output if i.type == "mcp_call"][:1]
    assert call.status == "failed" and "timed out after 3 s" in _error_text(call)
    assert hung.status == "completed"
    assert "time" in hung.output_text.lower(), hung.output_text     # the answer says so
    crashed = _forced(client, "toolbox", "crash", "Call the crash tool.")
    (call,) = [i for i in crashed.output if i.type == "mcp_call"][:1]
    assert call.status == "failed" and "stopped during the call" in \
        _error_text(call)
    assert httpx.get(f"{url}/health").status_code == 200
    # The toolbox starts again for the next call; the HTTP one answers too.
    for label in ("toolbox", "web"):
        added = _forced(client, label, "add", "Add 1234 and 4321 with the add tool.")
        (call,) = [i for i in added.output if i.type == "mcp_call"][:1]
        assert call.status == "completed" and call.output == "5555"


@pytest.mark.parametrize("path, body, says", [
    ("/v1/responses", {"input": "hi", "tools": [{"type": "mcp", "server_label": "nope"}]},
     "'nope' is not an MCP server configured"),
    ("/v1/responses", {"input": "hi", "tools": [{"type": "mcp", "server_label": "files",
                                                 "server_url": "https://example.com/mcp"}]},
     "reaches only the MCP servers its operator configured"),
    ("/v1/responses", {"input": "hi", "tools": [{"type": "mcp", "server_label": "files",
                                                 "headers": {"Authorization": "x"}}]},
     "headers"),
    ("/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
                      "mcp_servers": [{"type": "url", "name": "nope", "url": ""}]},
     "'nope' is not an MCP server configured"),
    ("/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
                      "mcp_servers": [{"type": "url", "name": "web",
                                       "url": "http://127.0.0.1:1/mcp"}]},
     "reaches only the MCP servers its operator configured"),
    ("/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
                      "mcp_servers": [{"type": "url", "name": "files", "url": "",
                                       "authorization_token": "t"}]},
     "authorization_token"),
])
def test_a_server_not_configured_or_a_url_is_a_400(served, path, body, says):
    url, _, _ = served
    r = httpx.post(url + path, json={"model": MODEL, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert says in error["message"]
    assert error["type"] == "invalid_request_error"
    if path == "/v1/messages":
        assert r.json()["type"] == "error"
    else:
        assert error["param"] == "tools"


def test_without_mcp_the_server_refuses_mcp_tools(server):
    r = httpx.post(f"{server.url}/v1/responses", json={
        "input": "hi", "tools": [{"type": "mcp", "server_label": "files"}]})
    assert r.status_code == 400 and "serve --mcp" in r.json()["error"]["message"]


"""MCP servers' tools, with real servers: the toolbox written with the
official SDK (tests/mcp_servers/toolbox.py) over stdio and over streamable
HTTP on loopback, and @modelcontextprotocol/server-filesystem from npm over
stdio (scripts/test installs it). The configuration, the hub's bounds, the
CLI, and a real model answering from a folder with the tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from conftest import wait_until
from llmctl.bench.launcher import free_port
from llmctl.config_file import load_config
from llmctl.errors import InvalidParams, UsageError
from llmctl.server.anthropic.mcp_request import mcp_asks
from llmctl.server.responses.mcp_request import call_id_of, item_id, mcp_ask
from llmctl.tools.mcp_config import McpServer, config_servers, load_mcp_file
from llmctl.tools.mcp_hub import McpError, McpHub, McpTool

HERE = Path(__file__).resolve().parent
TOOLBOX = HERE / "mcp_servers" / "toolbox.py"
REPO = HERE.parent
FS_SERVER = REPO / ".venv" / "mcp-node" / "node_modules" / "@modelcontextprotocol" / \
    "server-filesystem" / "dist" / "index.js"


def toolbox(tmp_path: Path, timeout: float = 60, **extra) -> Path:
    """An mcpServers file with the toolbox over stdio as `toolbox`."""
    spec = {"command": sys.executable, "args": [str(TOOLBOX), "stdio"], "timeout": timeout,
            "env": {"TOOLBOX_NOTES": str(tmp_path / "notes.log")}, **extra}
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"toolbox": spec}}))
    return path


def llmctl(*args: str, home: Path, stdin: str = "", timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "LLMCTL_HOME": str(home), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "llmctl", *args], capture_output=True, text=True,
                          env=env, input=stdin, timeout=timeout)


# ---- the configuration ----------------------------------------------------------------


@pytest.mark.parametrize("body, says", [
    ('{"mcpServers": {"a b": {"command": "x"}}}', "a b: a server's name must be"),
    ('{"mcpServers": {"x": {"command": "x", "url": "http://h/mcp"}}}', "not both"),
    ('{"mcpServers": {"x": {}}}', "needs a `command`"),
    ('{"mcpServers": {"x": {"url": "file:///etc/passwd"}}}', "x.url: must be an http"),
    ('{"mcpServers": {"x": {"command": "x", "args": "-y"}}}', "x.args: must be a list"),
    ('{"mcpServers": {"x": {"command": "x", "autoStart": true}}}', "x.autoStart: not a setting"),
    ('{"mcpServers": {"x": {"url": "http://h/mcp", "type": "sse"}}}', "x.type: 'sse' is not"),
    ('{"mcpServers": {"x": {"command": "x", "timeout": 0}}}', "x.timeout: must be a positive"),
    ('{"servers": []}', 'no "mcpServers" object'),
    ("not json", "not JSON"),
])
def test_a_bad_file_is_one_line_naming_the_key(tmp_path, body, says):
    path = tmp_path / "mcp.json"
    path.write_text(body)
    with pytest.raises(UsageError) as e:
        load_mcp_file(path)
    assert says in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_the_formats_people_have_are_read(tmp_path):
    claude = tmp_path / "claude.json"
    claude.write_text(json.dumps({"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "pkg", "/tmp"], "env": {"A": "1"}},
        "search": {"type": "http", "url": "https://example.com/mcp",
                   "headers": {"Authorization": "Bearer t"}, "allowedTools": ["find"]}}}))
    servers = load_mcp_file(claude)
    assert servers["files"].transport == "stdio" and servers["files"].args == ("-y", "pkg", "/tmp")
    assert servers["search"].transport == "http" and servers["search"].allowed_tools == ("find",)
    toml = tmp_path / "config.toml"
    toml.write_text('[mcp.servers.notes]\ncommand = "python3"\nargs = ["srv.py"]\n'
                    'env = { NOTES = "/tmp/n" }\ntimeout = 5\n')
    (notes,) = config_servers(load_config(toml)).values()
    assert (notes.label, notes.args, notes.env, notes.timeout_s) == \
        ("notes", ("srv.py",), {"NOTES": "/tmp/n"}, 5.0)
    toml.write_text('[mcp.servers.notes]\nurl = "ftp://x"\n')
    with pytest.raises(UsageError, match=r"config.toml:1: mcp.servers: notes.url"):
        config_servers(load_config(toml))


# ---- the hub, on the SDK's server -------------------------------------------------------


def test_tools_are_listed_and_called_over_stdio(tmp_path):
    hub = McpHub(load_mcp_file(toolbox(tmp_path)))
    try:
        tools = {t.name: t for t in hub.tools("toolbox")}
        assert set(tools) == {"add", "note", "hang", "crash"}
        assert tools["add"].read_only and not tools["note"].read_only
        assert hub.call("toolbox", "add", {"a": 2, "b": 40}).text == "42"
        bad = hub.call("toolbox", "add", {"a": "two"})
        assert bad.is_error
        with pytest.raises(McpError, match="no MCP server is configured as 'nope'"):
            hub.tools("nope")
    finally:
        hub.close()


def test_a_hanging_tool_is_cut_off_and_the_server_goes_on(tmp_path):
    hub = McpHub(load_mcp_file(toolbox(tmp_path, timeout=1)))
    try:
        hung = hub.call("toolbox", "hang", {"seconds": 30})
        assert hung.is_error and "timed out after 1 s" in hung.text
        assert hub.call("toolbox", "add", {"a": 1, "b": 1}).text == "2"
    finally:
        hub.close()


def test_a_server_that_dies_is_restarted_once_then_reported(tmp_path):
    hub = McpHub(load_mcp_file(toolbox(tmp_path)))
    try:
        first = hub.call("toolbox", "crash", {})
        assert first.is_error and "stopped during the call" in first.text
        assert hub.call("toolbox", "add", {"a": 2, "b": 2}).text == "4"     # restarted
        again = hub.call("toolbox", "crash", {})
        assert again.is_error and "stays stopped" in again.text
        gone = hub.call("toolbox", "add", {"a": 3, "b": 3})
        assert gone.is_error and "stopped again after a restart" in gone.text
    finally:
        hub.close()


def test_a_server_that_cannot_start_says_why(tmp_path):
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"broken": {
        "command": sys.executable, "args": ["-c", "import sys; sys.exit('no config here')"]}}}))
    hub = McpHub(load_mcp_file(path))
    try:
        with pytest.raises(McpError, match="'broken'") as e:
            hub.tools("broken")
        assert "\n" not in str(e.value)
    finally:
        hub.close()


def test_tools_over_streamable_http_on_loopback(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(TOOLBOX), "http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/mcp"

        def up():
            try:
                return httpx.get(url, timeout=2).status_code < 500
            except httpx.TransportError:
                return False

        wait_until(up, "the toolbox's HTTP server", timeout=60)
        path = tmp_path / "mcp.json"
        path.write_text(json.dumps({"mcpServers": {"box": {"url": url}}}))
        hub = McpHub(load_mcp_file(path))
        try:
            assert "add" in {t.name for t in hub.tools("box")}
            assert hub.call("box", "add", {"a": 20, "b": 22}).text == "42"
        finally:
            hub.close()
    finally:
        proc.terminate()
        proc.wait(30)


# ---- the filesystem server from npm -----------------------------------------------------


needs_fs = pytest.mark.skipif(not FS_SERVER.is_file(),
                              reason="@modelcontextprotocol/server-filesystem is not installed "
                                     "(scripts/test installs it with npm)")


def folder_with_notes(tmp_path: Path, **extra: object) -> tuple[Path, Path]:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "notes.txt").write_text("Buy oat milk. Call Ada at noon.\n")
    (folder / "todo.md").write_text("- ship the release\n")
    path = tmp_path / "fs.json"
    path.write_text(json.dumps({"mcpServers": {"files": {
        "command": "node", "args": [str(FS_SERVER), str(folder)], **extra}}}))
    return folder, path


@needs_fs
def test_the_filesystem_server_reads_a_folder(tmp_path):
    folder, path = folder_with_notes(tmp_path)
    hub = McpHub(load_mcp_file(path))
    try:
        names = {t.name for t in hub.tools("files")}
        assert {"read_text_file", "list_directory"} <= names
        listing = hub.call("files", "list_directory", {"path": str(folder)})
        assert "notes.txt" in listing.text and "todo.md" in listing.text
        read = hub.call("files", "read_text_file", {"path": str(folder / "notes.txt")})
        assert "oat milk" in read.text
        outside = hub.call("files", "read_text_file", {"path": "/etc/passwd"})
        assert outside.is_error
    finally:
        hub.close()


def test_mcp_ls_lists_servers_and_tools(tmp_path, session_home):
    r = llmctl("mcp", "ls", "--mcp", str(toolbox(tmp_path)), "--json", home=session_home)
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)
    assert row["server"] == "toolbox" and {t["name"] for t in row["tools"]} >= {"add", "note"}
    text = llmctl("mcp", "ls", "--mcp", str(toolbox(tmp_path)), home=session_home)
    assert text.returncode == 0 and "toolbox" in text.stdout and "add" in text.stdout
    bad = llmctl("mcp", "ls", "--mcp", str(tmp_path / "missing.json"), home=session_home)
    assert bad.returncode == 2 and "cannot read the MCP configuration" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.slow
def test_chat_lists_and_calls_tools_and_asks_before_a_write(tmp_path, session_home):
    notes = tmp_path / "notes.log"
    lines = "/tools\nUse the add tool to add 1234 and 4321.\nUse the note tool to note: buy milk\n"
    # The default model: the 0.5B sometimes writes the note call as text
    # (a near-tie that batch and thread timing can tip), so no call is asked.
    args = ("chat", "qwen2.5-coder-1.5b", "--mcp", str(toolbox(tmp_path)), "--temperature", "0",
            "--ctx-size", "4096")
    r = llmctl(*args, home=session_home, stdin=lines)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "toolbox.add (reads only)" in r.stdout and "toolbox.note:" in r.stdout
    assert "→ toolbox.add" in r.stderr and "5555" in r.stderr
    # No terminal to ask on: the write is declined, and nothing is written.
    assert "→ toolbox.note" in r.stderr and "not run without a yes" in r.stderr
    assert not notes.exists()
    yes = llmctl(*args, "--yes", home=session_home, stdin="Use the note tool to note: buy milk\n")
    assert yes.returncode == 0, yes.stderr[-2000:]
    assert "milk" in notes.read_text()


@pytest.mark.slow
@needs_fs
def test_run_on_the_default_model_reads_a_folder_and_answers(tmp_path, session_home):
    # The server's two reading tools: its fourteen, with their long
    # descriptions, are more than a 1.5B model keeps apart (docs/mcp.md).
    folder, path = folder_with_notes(tmp_path,
                                     allowedTools=["list_directory", "read_text_file"])
    question = f"Which files are in the folder {folder}, and what does notes.txt say?"
    r = llmctl("run", "qwen2.5-coder-1.5b", question, "--mcp", str(path), "--temperature", "0",
               "--ctx-size", "8192", "--max-tokens", "300", "--json", home=session_home,
               timeout=1800)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    outputs = " ".join(c["output"] for c in got["tool_calls"])
    assert "notes.txt" in outputs and "todo.md" in outputs and "oat milk" in outputs.lower()
    answer = got["text"].lower()
    assert "notes.txt" in answer and "oat milk" in answer, got


# ---- what a request may ask of the servers `serve --mcp` runs (no model) --------------


def _hub_of(**servers: McpServer) -> McpHub:
    return McpHub({label: replace(s, label=label) for label, s in servers.items()})


HUB = _hub_of(files=McpServer("files", command="node"), web=McpServer("web", url="http://h/mcp"))
ADD = McpTool("files", "add", "", {}, read_only=True)
WRITE = McpTool("files", "write", "", {}, read_only=False)


def test_responses_mcp_tools_pick_tools_and_approvals():
    ask = mcp_ask({"type": "mcp", "server_label": "files"}, "tools[0]", HUB)
    assert ask.allows(ADD) and ask.needs_approval(ADD)          # OpenAI's default: always
    ask = mcp_ask({"type": "mcp", "server_label": "files", "allowed_tools": {"read_only": True},
                   "require_approval": {"never": {"read_only": True}}}, "t", HUB)
    assert ask.allows(ADD) and not ask.allows(WRITE) and not ask.needs_approval(ADD)
    ask = mcp_ask({"type": "mcp", "server_label": "web", "server_url": "http://h/mcp",
                   "allowed_tools": ["write"], "require_approval": "never"}, "t", HUB)
    assert ask.allows(WRITE) and not ask.allows(ADD) and not ask.needs_approval(WRITE)


@pytest.mark.parametrize("tool, says", [
    ({"server_label": "nope"}, "'nope' is not an MCP server configured"),
    ({"server_label": "files", "server_url": "http://h/mcp"}, "reaches only the MCP servers"),
    ({"server_label": "web", "server_url": "http://elsewhere/mcp"}, "reaches only"),
    ({"server_label": "web", "authorization": "t"}, "'t.authorization'"),
    ({"server_label": "web", "connector_id": "connector_gmail"}, "connectors"),
    ({"server_label": "web", "require_approval": "sometimes"}, "require_approval"),
    ({"server_label": "web", "allowed_tools": "add"}, "allowed_tools"),
    ({"server_label": "web", "defer_loading": True}, "defer_loading"),
    ({"server_label": "web", "ssh": True}, "'t.ssh' is not supported"),
])
def test_responses_mcp_tools_refuse_by_name(tool, says):
    with pytest.raises(InvalidParams) as e:
        mcp_ask({"type": "mcp", **tool}, "t", HUB)
    assert says in e.value.message and e.value.param == "tools"


def test_no_hub_refuses_any_mcp_tool():
    with pytest.raises(InvalidParams) as e:
        mcp_ask({"type": "mcp", "server_label": "files"}, "t", None)
    assert "serve --mcp" in e.value.message


def test_anthropic_mcp_servers_and_toolsets():
    (ask,) = mcp_asks({"mcp_servers": [{"type": "url", "name": "web", "url": "http://h/mcp",
                                        "tool_configuration": {"allowed_tools": ["add"]}}]}, HUB)
    assert ask.label == "web" and not ask.ask_by_default
    assert ask.allows(replace(ADD, server="web")) and not ask.allows(replace(WRITE, server="web"))
    assert mcp_asks({"mcp_servers": [{"type": "url", "name": "files",
                                      "tool_configuration": {"enabled": False}}]}, HUB) == ()
    (ask,) = mcp_asks({"mcp_servers": [{"type": "url", "name": "files"}],
                       "tools": [{"type": "mcp_toolset", "mcp_server_name": "files",
                                  "configs": {"write": {"enabled": False}}}]}, HUB)
    assert ask.allows(ADD) and not ask.allows(WRITE)
    (ask,) = mcp_asks({"mcp_servers": [{"type": "url", "name": "files"}],
                       "tools": [{"type": "mcp_toolset", "mcp_server_name": "files",
                                  "default_config": {"enabled": False},
                                  "configs": {"write": {"enabled": True}}}]}, HUB)
    assert ask.allows(WRITE) and not ask.allows(ADD)
    for body in ({"mcp_servers": [{"type": "url", "name": "files", "authorization_token": "t"}]},
                 {"mcp_servers": [{"type": "url", "name": "web", "url": "https://x/mcp"}]},
                 {"mcp_servers": [{"type": "url", "name": "web"}, {"type": "url", "name": "web"}]},
                 {"mcp_servers": [], "tools": [{"type": "mcp_toolset", "mcp_server_name": "web"}]}):
        with pytest.raises(InvalidParams):
            mcp_asks(body, HUB)


def test_mcp_item_ids_lead_back_to_their_call():
    assert call_id_of(item_id("mcpr", "call_abc")) == "call_abc"
    assert call_id_of(item_id("mcp", "call_abc")) == "call_abc"
    assert call_id_of("something_else") == "something_else"

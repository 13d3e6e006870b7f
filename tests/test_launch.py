"""`llmctl launch`, tested with stand-in agent executables that record their
environment and make one real request: named `claude`, `codex` and
`mytool`, first on PATH, each a Python script that writes its argv, its
environment and the server's answer to a JSON file, then exits with a
chosen code. Driven as a user drives it: the real CLI in a subprocess, the
real SmolLM2 model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from conftest import ServerProcess, wait_until
from llmctl.bench.launcher import free_port

# The stand-in: which agent it plays comes from its file name.
STANDIN = '''#!{python}
import json, os, signal, sys, time, urllib.request, urllib.error

role = os.path.basename(sys.argv[0])
env = dict(os.environ)
# A Ctrl-C is the agent's to handle: this one notes it and carries on.
signal.signal(signal.SIGINT, lambda *_: open(env["STANDIN_RECORD"] + ".sigint", "w").close())
if role == "claude":
    url = env["ANTHROPIC_BASE_URL"] + "/v1/messages"
    headers = {{"Authorization": "Bearer " + env["ANTHROPIC_AUTH_TOKEN"],
               "anthropic-version": "2023-06-01",
               **dict(line.split(": ", 1) for line in env["ANTHROPIC_CUSTOM_HEADERS"].splitlines())}}
    body = {{"model": env["ANTHROPIC_MODEL"], "max_tokens": 8,
            "messages": [{{"role": "user", "content": "Say hi"}}]}}
elif role == "codex":
    # -c key=value, each value TOML; these are all TOML basic strings or ints.
    pairs = [v.split("=", 1) for flag, v in zip(sys.argv[1:], sys.argv[2:]) if flag == "-c"]
    c = {{k: json.loads(v) for k, v in pairs}}
    provider = "model_providers." + c["model_provider"]
    url = c[provider + ".base_url"] + "/responses"
    headers = {{"Authorization": "Bearer " + env[c[provider + ".env_key"]],
               **{{k.rsplit(".", 1)[1]: v for k, v in c.items() if ".http_headers." in k}}}}
    body = {{"model": c["model"], "input": "Say hi", "max_output_tokens": 8}}
else:
    url = env["OPENAI_BASE_URL"] + "/chat/completions"
    headers = {{"Authorization": "Bearer " + env["OPENAI_API_KEY"]}}
    body = {{"model": env["OPENAI_MODEL"], "max_tokens": 8, "temperature": 0,
            "messages": [{{"role": "user", "content": "Say hi"}}]}}
request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={{**headers, "Content-Type": "application/json"}})
try:
    with urllib.request.urlopen(request, timeout=120) as r:
        status, answer = r.status, json.loads(r.read())
except urllib.error.HTTPError as e:
    status, answer = e.code, e.read().decode(errors="replace")
with open(env["STANDIN_RECORD"], "w") as f:
    json.dump({{"argv": sys.argv, "env": env, "status": status, "answer": answer}}, f)
if env.get("STANDIN_SLEEP"):
    time.sleep(float(env["STANDIN_SLEEP"]))
sys.exit(int(env.get("STANDIN_EXIT", "0")))
'''


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("agents")
    for name in ("claude", "codex", "mytool"):
        script = folder / name
        script.write_text(STANDIN.format(python=sys.executable))
        script.chmod(0o755)
    return folder


def launch(*args: str, bin_dir: Path, record: Path, exit_code: int = 0,
           extra_env: dict | None = None, **popen) -> subprocess.Popen:
    env = {**os.environ, "NO_COLOR": "1", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "STANDIN_RECORD": str(record), "STANDIN_EXIT": str(exit_code), **(extra_env or {})}
    return subprocess.Popen([sys.executable, "-m", "llmctl", "launch", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out, err


def refuses(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=2)
    except httpx.TransportError:
        return True
    return False


def test_claude_on_a_started_server_which_stops_after(bin_dir, tmp_path):
    record = tmp_path / "claude.json"
    code, _, err = finish(launch("claude", "smollm2", "--", "--print", "hi", bin_dir=bin_dir,
                                 record=record, exit_code=7,
                                 extra_env={"ANTHROPIC_CUSTOM_HEADERS": "X-Team: blue"}))
    assert code == 7, err
    seen = json.loads(record.read_text())
    env = seen["env"]
    assert seen["argv"][1:] == ["--print", "hi"]
    assert env["ANTHROPIC_BASE_URL"].startswith("http://127.0.0.1:")
    assert env["ANTHROPIC_AUTH_TOKEN"] == "llmctl" and env["ANTHROPIC_API_KEY"] == ""
    for name in ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
                 "ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_SMALL_FAST_MODEL",
                 "CLAUDE_CODE_SUBAGENT_MODEL"):
        assert env[name] == "smollm2", name
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["API_TIMEOUT_MS"] == "1800000" and env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "4096"
    # The loop guard's header, after the user's own.
    assert env["ANTHROPIC_CUSTOM_HEADERS"] == "X-Team: blue\nx-llmctl-loop-guard: on"
    assert "warning: smollm2 (0.13B parameters) is too small for agents" in err
    assert seen["status"] == 200, seen["answer"]
    assert seen["answer"]["type"] == "message" and seen["answer"]["content"][0]["text"]
    # It said what it set, one line each, and stopped the server it started.
    assert f"  ANTHROPIC_BASE_URL={env['ANTHROPIC_BASE_URL']}" in err.splitlines()
    assert "context 8192, 2 slots" in err
    assert refuses(env["ANTHROPIC_BASE_URL"])


@pytest.fixture(scope="module")
def running(session_home):
    srv = ServerProcess(["smollm2", "--ctx-size", "1024", "--max-num-seqs", "2",
                         "--api-key", "sk-test-key-123456"],
                        env={"LLMCTL_HOME": str(session_home)})
    try:
        yield srv.wait_ready(600).url
    finally:
        srv.stop()


def test_codex_at_url_gets_a_responses_provider_and_leaves_the_server_up(bin_dir, tmp_path,
                                                                          running):
    record = tmp_path / "codex.json"
    code, _, err = finish(launch("codex", "--url", running, "--api-key", "sk-test-key-123456",
                                 "--", "exec", "fix it", bin_dir=bin_dir, record=record))
    assert code == 0, err
    seen = json.loads(record.read_text())
    assert seen["argv"][-2:] == ["exec", "fix it"]
    overrides = [a for a in seen["argv"][1:-2] if a != "-c"]
    assert overrides == ['model_provider="llmctl"', 'model_providers.llmctl.name="llmctl"',
                         f'model_providers.llmctl.base_url="{running}/v1"',
                         'model_providers.llmctl.wire_api="responses"',
                         'model_providers.llmctl.env_key="LLMCTL_API_KEY"',
                         "model_providers.llmctl.stream_idle_timeout_ms=1800000",
                         'model_providers.llmctl.http_headers.x-llmctl-loop-guard="on"',
                         'model="smollm2"',
                         "model_context_window=1024",
                         "model_auto_compact_token_limit=819"]
    assert seen["env"]["LLMCTL_API_KEY"] == "sk-test-key-123456"
    assert seen["status"] == 200, seen["answer"]
    assert seen["answer"]["object"] == "response" and seen["answer"]["output"]
    # The key is masked where launch prints it.
    assert "  LLMCTL_API_KEY=****3456" in err.splitlines() and "sk-test" not in err
    assert not refuses(running)


def test_any_openai_tool_at_url(bin_dir, tmp_path, running):
    record = tmp_path / "mytool.json"
    code, _, err = finish(launch("openai", "smollm2", "--url", running + "/v1", "--api-key",
                                 "sk-test-key-123456", "--", "mytool", "--flag",
                                 bin_dir=bin_dir, record=record, exit_code=3))
    assert code == 3, err
    seen = json.loads(record.read_text())
    assert seen["argv"][1:] == ["--flag"]
    assert seen["env"]["OPENAI_BASE_URL"] == seen["env"]["OPENAI_API_BASE"] == running + "/v1"
    assert seen["env"]["OPENAI_MODEL"] == "smollm2"
    assert seen["status"] == 200, seen["answer"]
    assert seen["answer"]["choices"][0]["message"]["content"]
    assert not refuses(running)


def test_sigint_is_the_agents_and_sigterm_reaches_it_and_the_server_still_stops(bin_dir,
                                                                              tmp_path):
    record = tmp_path / "claude.json"
    # Its own session: launch and the agent are a terminal's foreground group.
    proc = launch("claude", "smollm2", bin_dir=bin_dir, record=record,
                  extra_env={"STANDIN_SLEEP": "120"}, start_new_session=True)
    wait_until(record.exists, "the stand-in's request", timeout=300)
    url = json.loads(record.read_text())["env"]["ANTHROPIC_BASE_URL"]
    # A Ctrl-C at a terminal reaches the whole group: the agent decides,
    # launch keeps waiting and the server (in a session of its own) keeps
    # serving. The agent noting the signal shows it was delivered; the
    # server then answering a request gives launch time to act, had it.
    os.killpg(proc.pid, signal.SIGINT)
    wait_until(Path(f"{record}.sigint").exists, "the agent to note the Ctrl-C", timeout=60)
    assert not refuses(url) and proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert refuses(url)


@pytest.mark.parametrize("args, message", [
    (["bogus"], "unknown agent 'bogus'; known agents: claude, codex, openai"),
    (["openai", "--", "no-such-tool"], "'no-such-tool' is not on PATH"),
    (["codex", "--url", "http://127.0.0.1:{port}"], "cannot reach http://127.0.0.1:{port}"),
    (["codex", "--url", "http://127.0.0.1:{port}", "--ctx-size", "4096"],
     "--ctx-size: only for the server launch starts"),
])
def test_bad_input_is_one_line_and_non_zero(bin_dir, tmp_path, args, message):
    port = free_port()
    args = [a.format(port=port) for a in args]
    code, out, err = finish(launch(*args, bin_dir=bin_dir, record=tmp_path / "none.json"))
    assert code != 0 and out == ""
    assert err.startswith("error: ") and message.format(port=port) in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "none.json").exists()


def test_a_model_the_url_does_not_serve_is_refused(bin_dir, tmp_path, running):
    code, _, err = finish(launch("claude", "qwen2.5-coder-0.5b", "--url", running, "--api-key",
                                 "sk-test-key-123456", bin_dir=bin_dir, record=tmp_path / "x"))
    assert code == 2 and "does not serve 'qwen2.5-coder-0.5b' (it serves: smollm2)" in err
    assert len(err.strip().splitlines()) == 1


def test_missing_agent_says_how_to_install_it(tmp_path):
    env = {**os.environ, "NO_COLOR": "1", "PATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "llmctl", "launch", "claude"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr == ("error: 'claude' is not on PATH; install it with: "
                           "npm install -g @anthropic-ai/claude-code\n")


def test_dry_run_json_is_the_plan_and_help_fits_80_columns(bin_dir, tmp_path):
    code, out, err = finish(launch("codex", "smollm2", "--dry-run", "--json", "--ctx-size",
                                   "2048", "--max-num-seqs", "1", bin_dir=bin_dir,
                                   record=tmp_path / "x"))
    assert code == 0, err
    plan = json.loads(out)
    assert plan["server"] == "started" and plan["ctx_size"] == 2048 and plan["max_num_seqs"] == 1
    assert plan["argv"][0] == str(bin_dir / "codex") and "model_context_window=2048" in plan["argv"]
    assert not any("max_output" in a for a in plan["argv"])   # Codex 0.171 has no such key
    assert plan["env"] == {"LLMCTL_API_KEY": "llmctl"}
    assert refuses(plan["url"])      # nothing was started
    proc = subprocess.run([sys.executable, "-m", "llmctl", "launch", "--help"],
                          env={**os.environ, "COLUMNS": "80", "NO_COLOR": "1"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Example: llmctl launch claude" in proc.stdout
    assert "[-- ARGS]..." in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80

"""The CLI as a user drives it: CliRunner in-process, subprocess end to end."""

import json
import os
import socket
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from llmctl.cli.app import app

runner = CliRunner()
FAST = ["--temperature", "0", "--max-tokens", "12", "--ctx-size", "512"]


def invoke(*args, input=None):
    return runner.invoke(app, list(args), input=input)


def test_run_is_deterministic_at_temperature_zero():
    a = invoke("run", "smollm2", "Name a colour.", *FAST)
    b = invoke("run", "smollm2", "Name a colour.", *FAST)
    assert a.exit_code == 0, a.output
    assert a.stdout.strip() and a.stdout == b.stdout


def test_run_json_and_stdin_prompt():
    r = invoke("run", "smollm2", "-", "--json", *FAST, input="Say hello.")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert set(data) >= {"text", "prompt_tokens", "completion_tokens", "ttft_s", "tokens_per_s"}
    assert data["text"] and 0 < data["completion_tokens"] <= 12 and data["prompt_tokens"] > 5


def test_run_stats_go_to_stderr():
    r = invoke("run", "smollm2", "Hi", "--stats", *FAST)
    assert r.exit_code == 0
    assert "tok/s" in r.stderr and "tok/s" not in r.stdout


def test_unknown_model_suggests_close_names_and_exits_2():
    r = invoke("run", "smollm", "Hi")
    assert r.exit_code == 2
    assert "did you mean smollm2" in r.stderr and "llmctl list" in r.stderr
    assert "Traceback" not in r.output


def test_non_gguf_file_exits_2_naming_the_file(tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("hello")
    r = invoke("run", str(bad), "Hi")
    assert r.exit_code == 2 and "notes.gguf" in r.stderr and "not a GGUF" in r.stderr


def test_prompt_longer_than_context_is_a_clear_error():
    r = invoke("run", "smollm2", "word " * 400, "--ctx-size", "128", "--max-tokens", "4")
    assert r.exit_code == 2
    assert "exceeds the context of" in r.stderr


def test_invalid_option_values_are_usage_errors():
    r = invoke("run", "smollm2", "Hi", "--temperature", "-1")
    assert r.exit_code == 2 and "Invalid value" in r.output
    r = invoke("run", "smollm2", "Hi", "--n-gpu-layers", "lots")
    assert r.exit_code == 2 and "auto" in r.output


def test_chat_with_piped_stdin_answers_each_line_plainly():
    r = invoke("chat", "smollm2", *FAST, input="Hello!\n/stats\nWhat is 2+2?\n")
    assert r.exit_code == 0, r.output
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    assert len(lines) >= 3
    assert lines[1].startswith("prompt ") and "tok/s" in lines[1]
    assert "\x1b[" not in r.stdout       # no colour codes when not a terminal


def test_list_show_info_json():
    invoke("run", "smollm2", "Hi", *FAST)
    listed = json.loads(invoke("list", "--json").stdout)
    assert "smollm2" in [m["name"] for m in listed["models"]]
    shown = json.loads(invoke("show", "smollm2", "--ctx-size", "2048", "--json").stdout)
    assert shown["architecture"] == "llama" and shown["memory"]["ctx_size"] == 2048
    assert shown["memory"]["total_bytes"] == shown["size"] + shown["memory"]["kv_cache_bytes"]
    info = json.loads(invoke("info", "--json").stdout)
    assert info["default_threads"] == info["physical_cores"] >= 1
    assert info["gpu_offload"] is False and info["gpus"] == []
    assert "AVX2" in info["cpu_features"] or "NEON" in info["cpu_features"]


def test_help_shows_examples():
    for cmd in ("run", "chat", "serve", "list", "show", "rm", "info"):
        r = invoke(cmd, "--help")
        assert r.exit_code == 0 and "Example: llmctl" in r.stdout, cmd


def test_subprocess_end_to_end_and_debug_traceback(tmp_path):
    env = {**os.environ, "NO_COLOR": "1"}
    ok = subprocess.run([sys.executable, "-m", "llmctl", "run", "smollm2", "Hi", *FAST],
                        capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0 and ok.stdout.strip()
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    plain = subprocess.run([sys.executable, "-m", "llmctl", "show", str(bad)],
                           capture_output=True, text=True, env=env, timeout=60)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert len(plain.stderr.strip().splitlines()) == 1 and plain.stderr.startswith("error:")
    debug = subprocess.run([sys.executable, "-m", "llmctl", "--debug", "show", str(bad)],
                           capture_output=True, text=True, env=env, timeout=60)
    assert debug.returncode == 2 and "Traceback" in debug.stderr


def test_second_architecture_gemma3(tmp_path):
    r = invoke("run", "gemma3-270m", "Say hi.", *FAST)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip()
    shown = json.loads(invoke("show", "gemma3-270m", "--json").stdout)
    assert shown["architecture"] == "gemma3" and shown["quant"] == "Q4_K_M"


@pytest.mark.parametrize("name,value", [("ENGINE_STALL_S", "soon"), ("GRAMMAR_BUDGET_MS", "0"),
                                        ("EMBED_MAX_TOKENS", "1.5"), ("WORKERS_PARSE", "0")])
def test_serve_refuses_a_bad_setting_before_it_listens(monkeypatch, name, value):
    # A setting is the operator's mistake: one line at start, not a client's 400 later.
    monkeypatch.setenv(f"LLMCTL_{name}", value)
    # A port already taken: should the check be skipped, serve fails fast
    # on the port instead of serving forever.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = invoke("serve", "smollm2", "--port", str(taken.getsockname()[1]))
    assert r.exit_code == 2
    assert f"LLMCTL_{name}" in r.stderr and "Traceback" not in r.output


@pytest.mark.parametrize("flags,why", [(["--deterministic", "--repack"], "--deterministic and --repack"),
                                       (["--deterministic", "--flash-attn", "off"],
                                        "--deterministic needs flash attention")])
def test_deterministic_refuses_the_settings_that_are_not_exact(flags, why):
    # The default is exact; --deterministic is kept for scripts and says no
    # to what would break it, in one line, before any model loads.
    with socket.socket() as taken:       # should the check be skipped, serve fails fast
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = invoke("serve", "smollm2", "--port", str(taken.getsockname()[1]), *flags)
    assert r.exit_code == 2 and why in r.stderr and "Traceback" not in r.output
    assert len(r.stderr.strip().splitlines()) == 1

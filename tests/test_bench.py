"""`llmctl bench` against a stub server with a known pace, plus its input
checks and, once `llmctl serve` exists, one small run against it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from conftest import smollm2_file
from llmctl.bench import api, report
from llmctl.bench.launcher import Server, free_port
from llmctl.bench.prompts import build_prompts
from llmctl.bench.stats import best_under_slo, percentile
from llmctl.bench.tokenizers import ApproxTokenizer
from llmctl.bench.workloads import make_workload, parse_concurrency
from llmctl.errors import UsageError

STUB = Path(__file__).with_name("stub_openai.py")
REPO = Path(__file__).resolve().parents[1]
TTFT, ITL = 0.1, 0.02   # the stub's pace


class Stub(Server):
    """tests/stub_openai.py at a known pace; `with Stub(...) as stub:`."""

    def __init__(self, *args: str, ttft: float = TTFT, itl: float = ITL):
        super().__init__([sys.executable, str(STUB), "--ttft", str(ttft), "--itl", str(itl),
                          *args], name="stub_openai")

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/stats").json()

    def reset(self) -> None:
        httpx.post(f"{self.url}/reset")


@pytest.fixture(scope="module")
def stub():
    with Stub("--tokenize") as s:
        yield s


def llmctl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", "llmctl", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO)


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, needle: str) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0], proc.stderr


# --- input checks -------------------------------------------------------------

def test_concurrency_list_parses_sorts_and_dedups():
    assert parse_concurrency("16, 1,4,4", requests=8) == [1, 4, 16]


def test_default_sweep_goes_from_serial_to_all_at_once():
    assert parse_concurrency(None, requests=64) == [1, 2, 4, 8, 16, 32, 64]
    assert parse_concurrency(None, requests=6) == [1, 2, 4, 6]
    assert parse_concurrency(None, requests=1) == [1]


@pytest.mark.parametrize("bad", ["", "1,x", "4,,8", "0", "-2", "1.5", "1;4", "99999"])
def test_invalid_concurrency_lists_are_usage_errors(bad):
    with pytest.raises(UsageError, match="concurrency"):
        parse_concurrency(bad, requests=8)


def test_workload_presets_scale_and_custom():
    assert make_workload(None, None, None) == make_workload("prefill-heavy", None, None)
    wl = make_workload("decode-heavy", None, None, scale=0.25)
    assert (wl.input_tokens, wl.output_tokens) == (32, 256)
    wl = make_workload(None, 100, 10, shared_prefix=50)
    assert (wl.name, wl.input_tokens, wl.output_tokens, wl.shared_prefix) == ("custom", 100, 10, 50)


@pytest.mark.parametrize("args, needle", [
    (("custom", 100, None), "both"),
    (("prefill-heavy", 100, None), "custom"),
    (("chatty", None, None), "unknown workload"),
    (("custom", 4, 10), "at least"),
    (("custom", 100, 0), "at least 1"),
])
def test_bad_workloads_are_usage_errors(args, needle):
    with pytest.raises(UsageError, match=needle):
        make_workload(*args)


def test_shared_prefix_must_leave_room_for_the_unique_part():
    with pytest.raises(UsageError, match="shared-prefix"):
        make_workload("custom", 64, 8, shared_prefix=60)


def test_percentile_interpolates_like_numpy():
    data = [float(x) for x in range(1, 101)]
    assert percentile(data, 50) == pytest.approx(50.5)
    assert percentile(data, 95) == pytest.approx(95.05)
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) is None


def test_slo_picks_highest_throughput_meeting_p95_without_errors():
    def lv(c, rps, p95, errors=0):
        return {"concurrency": c, "requests_per_s": rps, "ttft": {"p95": p95},
                "ok": 8 - errors, "errors": errors}
    levels = [lv(1, 1.0, 0.1), lv(4, 3.0, 0.4), lv(8, 5.0, 0.9), lv(16, 6.0, 0.5, errors=2),
              lv(32, 7.0, 2.0)]
    assert best_under_slo(levels, 1.0)["concurrency"] == 8
    assert best_under_slo(levels, 0.3)["concurrency"] == 1
    assert best_under_slo(levels, 0.05) is None


# --- prompts ------------------------------------------------------------------

def test_prompts_are_exact_unique_and_share_only_the_asked_prefix():
    tok = ApproxTokenizer()
    prompts = build_prompts(tok, 20, 50, shared_prefix=0, seed=1)
    assert {p.tokens for p in prompts} == {50}
    assert all(len(tok.encode(p.text)) == 50 for p in prompts)
    assert len({p.text.split()[0] for p in prompts}) == 20   # differ from the first word
    again = build_prompts(tok, 20, 50, shared_prefix=0, seed=2)
    assert not {p.text for p in prompts} & {p.text for p in again}
    shared = build_prompts(tok, 5, 50, shared_prefix=20, seed=3)
    ids = [tok.encode(p.text) for p in shared]
    assert os.path.commonprefix(ids) == ids[0][:20]
    assert {len(i) for i in ids} == {50}


def test_prompts_hit_exact_counts_with_the_gguf_tokenizer():
    path = smollm2_file()
    from llmctl.bench.tokenizers import GgufTokenizer

    tok = GgufTokenizer(path)
    for n, shared in ((1024, 0), (100, 40), (9, 0)):
        prompts = build_prompts(tok, 8, n, shared_prefix=shared, seed=7)
        ids = [tok.encode(p.text) for p in prompts]
        assert {len(i) for i in ids} == {n}
        assert len(os.path.commonprefix(ids)) in ((0, 1) if not shared else (shared,))


# --- against the stub ---------------------------------------------------------

def test_measured_timings_follow_the_stub_pace(stub, tmp_path):
    # Only bounds that hold on any machine, however loaded: the stub cannot
    # answer before its pace (lateness only adds), and a closed loop cannot
    # have more than c requests in flight.
    stub.reset()
    out_tokens = 11
    run = api.bench(url=stub.url, workload="custom", input_tokens=40,
                    output_tokens=out_tokens, requests=8, concurrency="1,4",
                    json_file=tmp_path / "run.json")
    for lv in run["levels"]:
        assert lv["errors"] == 0 and lv["ok"] == 8
        results = lv["results"]
        assert len(results) == 8 and all(len(r["itl"]) == out_tokens - 1 for r in results)
        for r in results:
            assert TTFT <= r["ttft"] < r["e2e"], r
            assert r["e2e"] >= TTFT + (out_tokens - 1) * ITL, r
        # Summed request time fits in c x wall time: requests/s x mean E2E <= c.
        assert lv["requests_per_s"] * lv["e2e"]["mean"] <= lv["concurrency"] * (1 + 1e-9)
        assert lv["output_tokens_per_s"] == pytest.approx(lv["requests_per_s"] * out_tokens)
        assert lv["mean_output_tokens"] == out_tokens          # usage, with ignore_eos
        assert lv["mean_prompt_tokens"] == 40                  # exact, via /tokenize
    serial, parallel = run["levels"]
    # The stub paces every request on its own clock, so 4 streams finish the
    # same 8 requests in about a quarter of the serial time.
    assert parallel["requests_per_s"] > serial["requests_per_s"]
    assert run["tokenizer"] == "server" and run["target"]["ignore_eos"]
    seen = stub.stats()
    assert seen["max_in_flight"] == 4
    assert seen["distinct_prompts"] == seen["requests"] == 1 + 16   # the probe + 2 levels
    saved = json.loads((tmp_path / "run.json").read_text())
    assert saved["levels"][1]["results"][0]["ttft"] == run["levels"][1]["results"][0]["ttft"]


def test_a_slower_pace_measures_slower():
    # Opposite paces, each 8x or more apart: the ordering survives any noise
    # that absolute bounds would not.
    levels = []
    for pace in ({"ttft": 0.02, "itl": 0.08}, {"ttft": 0.3, "itl": 0.01}):
        with Stub(**pace) as stub:
            run = api.bench(url=stub.url, workload="custom", input_tokens=8,
                            output_tokens=6, requests=4, concurrency="2")
        levels.append(run["levels"][0])
    quick_start, quick_tokens = levels
    assert quick_start["ttft"]["p50"] < quick_tokens["ttft"]["p50"]
    assert quick_start["itl"]["p50"] > quick_tokens["itl"]["p50"]


def test_servers_that_reject_ignore_eos_get_requests_without_it():
    with Stub("--reject-ignore-eos") as stub:
        run = api.bench(url=stub.url, workload="custom", input_tokens=16, output_tokens=8,
                        requests=2, concurrency="2")
    lv = run["levels"][0]
    assert not run["target"]["ignore_eos"] and lv["errors"] == 0
    assert lv["mean_output_tokens"] == 3          # the stub's own EOS, now counted honestly
    assert run["tokenizer"] == "approx" and lv["mean_prompt_tokens"] == 16


def test_api_key_is_sent_and_a_refusal_is_an_auth_error(monkeypatch):
    monkeypatch.delenv("LLMCTL_API_KEY", raising=False)
    with Stub("--api-key", "sesame", "--tokenize") as stub:
        proc = llmctl("bench", "--url", stub.url, "--workload", "custom", "--input-tokens",
                      "16", "--output-tokens", "2", "-n", "1", "-c", "1")
        run = api.bench(url=stub.url, workload="custom", input_tokens=16, output_tokens=2,
                        requests=1, concurrency="1", api_key="sesame")
    assert_one_line_error(proc, 3, "--api-key")
    assert run["levels"][0]["ok"] == 1 and run["tokenizer"] == "server"


def test_cli_counts_server_errors_and_writes_json_plot_and_compare(tmp_path):
    with Stub("--fail-every", "3") as stub:
        args = ["bench", "--url", stub.url + "/v1", "--workload", "custom",
                "--input-tokens", "16", "--output-tokens", "4", "-n", "6", "-c", "2,6",
                "--slo-ttft", "5", "--json", str(tmp_path / "a.json")]
        if importlib.util.find_spec("matplotlib"):
            args += ["--plot", str(tmp_path / "a.png")]
        proc = llmctl(*args)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "HTTP 500: stub failure" in proc.stderr
    run = json.loads((tmp_path / "a.json").read_text())
    # The probe is request 1; each level's 6 then include 2 failures.
    assert [(lv["ok"], lv["errors"]) for lv in run["levels"]] == [(4, 2), (4, 2)]
    assert [r["error"] for r in run["levels"][0]["results"]].count("HTTP 500: stub failure") == 2
    assert run["best_under_slo"] is None        # levels with errors do not qualify
    assert "No level meets" in proc.stdout
    for lv in run["levels"]:
        assert f"\n{lv['concurrency']:>4} " in "\n" + proc.stdout, proc.stdout
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The same run against itself: every ratio 1.00x.
    cmp = llmctl("bench", "--compare", str(tmp_path / "a.json"), str(tmp_path / "a.json"))
    assert cmp.returncode == 0, cmp.stderr
    assert cmp.stdout.count("1.00x") >= 2 * 9 and "TTFT p95" in cmp.stdout


def test_a_server_failing_every_request_is_an_error_not_a_crash(tmp_path):
    with Stub("--fail-every", "1") as stub:
        proc = llmctl("bench", "--url", stub.url, "--workload", "custom", "--input-tokens",
                      "16", "--output-tokens", "4", "-n", "3", "-c", "1,3")
    assert_one_line_error(proc, 1, "all 6 requests failed: HTTP 500: stub failure")


def test_unreachable_url_is_a_one_line_error():
    port = free_port()   # closed again: nothing listens there
    proc = llmctl("bench", "--url", f"http://127.0.0.1:{port}", "-n", "2", "-c", "1")
    assert_one_line_error(proc, 1, f"cannot reach http://127.0.0.1:{port}/v1")


@pytest.mark.parametrize("args, needle", [
    (["--concurrency", "1,x"], "'x' is not an integer"),
    (["--concurrency", "0,4"], "between 1 and"),
    (["--url", "localhost:8080"], "invalid --url"),
    (["--workload", "custom", "--input-tokens", "64"], "--output-tokens"),
    (["--slo-ttft", "0"], "--slo-ttft"),
    (["--plot", "out.jpg"], "PNG"),
])
def test_bad_cli_input_is_a_usage_error(args, needle):
    proc = llmctl("bench", "--url", "http://127.0.0.1:9", *args) if "--url" not in args \
        else llmctl("bench", *args)
    assert_one_line_error(proc, 2, needle)


def test_unknown_model_fails_before_starting_a_server():
    assert_one_line_error(llmctl("bench", "no-such-model-xyz"), 2, "unknown model")


def test_compare_rejects_files_that_are_not_runs(tmp_path):
    (tmp_path / "x.json").write_text('{"hello": 1}')
    proc = llmctl("bench", "--compare", str(tmp_path / "x.json"), str(tmp_path / "nope.json"))
    assert_one_line_error(proc, 2, "not an `llmctl bench --json` file")


def test_compare_table_ratios():
    def run(rps, p95):
        lv = {"concurrency": 4, "requests_per_s": rps, "output_tokens_per_s": rps * 10,
              "ttft": {"p50": p95, "p95": p95, "p99": p95}, "itl": {"p50": 0.02, "p95": 0.03},
              "e2e": {"p50": 1.0, "p95": 1.2}, "errors": 0}
        return {"llmctl_bench": 1, "levels": [lv], "tokenizer": "gguf",
                "target": {"model": "m", "url": "u", "ignore_eos": True},
                "workload": {"name": "custom", "input_tokens": 8, "output_tokens": 8,
                             "shared_prefix": 0}}
    from rich.console import Console

    console = Console(width=120, record=True, no_color=True)
    console.print(report.compare_table(run(2.0, 0.5), run(3.0, 0.25), "a", "b"))
    text = console.export_text()
    assert "1.50x" in text and "0.50x" in text


# --- against the real server --------------------------------------------------

@pytest.mark.slow
def test_bench_against_llmctl_serve_with_the_default_model(tmp_path):
    # Tiny on purpose: this checks the wiring and exact token counts, not speed.
    proc = llmctl("bench", "--workload", "custom", "--input-tokens", "24",
                  "--output-tokens", "4", "-n", "1", "-c", "1,2",
                  "--json", str(tmp_path / "real.json"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    run = json.loads((tmp_path / "real.json").read_text())
    assert run["target"]["launched"] and run["tokenizer"] == "gguf"
    for lv in run["levels"]:
        assert lv["errors"] == 0, lv["error_messages"]
        assert lv["mean_prompt_tokens"] == 24          # the GGUF tokenizer is exact
        assert lv["mean_output_tokens"] == 4           # ignore_eos honoured
        assert lv["requests_per_s"] > 0 and lv["ttft"]["p50"] > 0
    # bench stopped the server it started: its port is closed again.
    with pytest.raises(httpx.TransportError):
        httpx.get(run["target"]["url"] + "/models", timeout=2)

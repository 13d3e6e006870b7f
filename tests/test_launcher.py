"""The one process harness (llmctl.bench.launcher) that `llmctl bench`, the
benchmark scripts and the tests start servers with."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import httpx
import pytest

from llmctl.bench.launcher import Server, http_ok, variant
from llmctl.errors import ServeFailed, UsageError

STUB = str(Path(__file__).with_name("stub_openai.py"))


def python(code: str) -> list[str]:
    # `--port N` lands in sys.argv, where these snippets ignore it.
    return [sys.executable, "-c", code]


def test_a_server_is_ready_then_stopped_gracefully():
    with Server([sys.executable, STUB]) as srv:
        assert srv.returncode is None
        assert http_ok("/nope", "/v1/models")(srv.url)
        assert not http_ok("/nope")(srv.url)
    # uvicorn shuts down on SIGTERM, then (in recent versions) re-raises it.
    assert srv.returncode in (0, -signal.SIGTERM)
    with pytest.raises(httpx.TransportError):
        httpx.get(srv.url + "/health", timeout=2)


def test_a_server_that_exits_early_fails_with_its_log_tail():
    srv = Server(python("import sys; print('no model here'); sys.exit(3)"), name="fake serve")
    with pytest.raises(ServeFailed, match=r"`fake serve` exited with code 3: no model here"):
        with srv:
            pass


def test_a_server_never_ready_fails_and_is_stopped():
    srv = Server(python("import time; print('loading', flush=True); time.sleep(60)"),
                 ready=lambda url: False, startup_timeout=0.5)
    with pytest.raises(ServeFailed, match="not ready after .*loading"):
        with srv:
            pass
    assert srv.returncode is not None


def test_stop_kills_a_server_that_ignores_sigterm():
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('up', flush=True); time.sleep(60)")
    srv = Server(python(code), ready=lambda url: "up" in srv.log_tail())
    with srv:
        srv.stop(grace=0.5)
    assert srv.returncode == -signal.SIGKILL


def test_a_variant_names_its_arm_and_splits_its_flags_as_a_shell_would():
    assert variant("fa-off=--flash-attn off") == ("fa-off", ["--flash-attn", "off"])
    assert variant("sys=--system 'two words'") == ("sys", ["--system", "two words"])
    assert variant("plain") == ("plain", [])
    with pytest.raises(ValueError):
        variant("bad=--system 'unclosed")


def _bench_serve():
    sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
    try:
        import bench_serve
    finally:
        sys.path.pop(0)
    return bench_serve


def test_a_tree_arm_runs_that_trees_llmctl(tmp_path):
    """bench_serve's --tree: the arm runs `python -m llmctl` from the given
    tree, ahead of the installed one (here a tree whose llmctl is the stub)."""
    pkg = tmp_path / "llmctl"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(
        f"import runpy, sys\nsys.argv = [{STUB!r}, *sys.argv[-2:]]\n"
        f"runpy.run_path({STUB!r}, run_name='__main__')\n")
    arms = _bench_serve().servers(2, None, False, trees=(f"old={tmp_path}",),
                                  serve_flags=("--flash-attn", "on"))
    assert set(arms) == {"llmctl serve", "llmctl serve old"}
    with arms["llmctl serve old"]() as srv:
        assert srv.argv[-4:-2] == ["--flash-attn", "on"]
        models = httpx.get(srv.url + "/v1/models", timeout=5).json()
        assert models["data"][0]["id"] == "stub-model"      # the tree's, not the installed


def test_a_tree_without_llmctl_is_refused(tmp_path):
    with pytest.raises(UsageError, match="no llmctl package"):
        _bench_serve().servers(2, None, False, trees=(f"old={tmp_path}",))


def test_ratios_against_an_llmctl_arm_pair_each_round(capsys):
    """bench_serve's --against: each llmctl arm is also reported against
    the named llmctl arm, round by round, on the levels that ran."""
    def rnd(tok_s, ttft):
        return {"c16": {"tok_s": tok_s, "ttft_p50": ttft}}
    runs = {"llmctl serve": [rnd(90.0, 2.0), rnd(120.0, 1.0)],
            "llmctl serve nospec": [rnd(100.0, 1.0), rnd(100.0, 1.0)],
            "llmctl serve fa-off": [rnd(50.0, 4.0), rnd(50.0, 4.0)]}
    out = _bench_serve()._ratios("llmctl serve", runs, ("llmctl serve nospec",))
    assert set(out) == {"llmctl serve nospec"}
    assert out["llmctl serve nospec"]["c16 tok_s"]["rounds"] == [0.9, 1.2]
    assert out["llmctl serve nospec"]["c16 tok_s"]["median"] == pytest.approx(1.05)
    assert "c1 tok_s" not in out["llmctl serve nospec"]
    assert "llmctl serve/llmctl serve nospec: c=16 tok/s x1.05" in capsys.readouterr().out

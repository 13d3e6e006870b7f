"""scripts/bench_matmul.py: a build compared with itself gives the same
bits in every round, and its table has a ratio for each case; a bad shape
is refused by name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, script_module
from llmctl.native import library_path


@pytest.fixture(scope="module")
def bench():
    with script_module("bench_matmul") as module:
        yield module


def test_a_build_against_itself_has_the_same_bits(tmp_path):
    lib = library_path()
    assert lib is not None
    r = subprocess.run([sys.executable, str(REPO / "scripts/bench_matmul.py"), "--rows", "1,9,20",
                        "--shapes", "Q4_K:32x512,Q6_K:16x256,Q8_K:1x512", "--repeat", "2", "--rounds", "2",
                        "--lib", f"again={lib.parent}", "--json"],
                       capture_output=True, text=True, timeout=300, check=True)
    out = json.loads(r.stdout)
    assert out["same_bits"] == {"this build": True, "again": True}
    assert [row["case"] for row in out["table"]] == [
        f"{t}:{n}" for t in ("Q4_K:32x512", "Q6_K:16x256", "Q8_K:1x512") for n in (1, 9, 20)]
    for row in out["table"]:
        ratio, lo, hi = row["again / this build"]
        assert row["this build"] > 0 and row["again"] > 0 and lo <= ratio <= hi


@pytest.mark.parametrize("text", ["Q4_0:8x256", "Q4_K:8x100", "Q4_K:8", "Q4_K:ax256", "Q8_K:2x256"])
def test_a_bad_shape_is_refused(bench, text):
    with pytest.raises(SystemExit, match="bad shape"):
        bench.parse_shapes(text)

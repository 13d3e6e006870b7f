"""A join of part files killed half-way leaves its temp behind; the next
resolution must remove it (issue 20, finding 13). Real gemma3-270m parts,
a real join in a real process, killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from llmctl.store import resolve_model
from llmctl.store.registry import load_registry

# Joins gemma3-270m with a progress callback that stalls after the first
# block, so the temp file exists (and stays) until the test kills it.
JOIN = """
import sys, time
from llmctl.store import resolve_model
def stall(done, total):
    if done:
        print("joining", flush=True)
        time.sleep(600)
resolve_model("gemma3-270m", progress=stall)
"""


def temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".*.tmp")) if folder.exists() else []


def test_a_killed_joins_temp_is_removed_by_the_next_resolve(empty_home):
    spec = load_registry().get("gemma3-270m")
    folder = empty_home / "models" / spec.name
    proc = subprocess.Popen([sys.executable, "-c", JOIN], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "LLMCTL_HOME": str(empty_home)})
    try:
        assert proc.stdout.readline().strip() == "joining", "the join never started"
        left = temps(folder)
        assert len(left) == 1 and (folder / left[0]).stat().st_size > 0
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert temps(folder) == left            # SIGKILL ran no clean-up: the temp stayed
    # Seconds old and its pid dead: the next join must not wait a minute for it.
    r = resolve_model("gemma3-270m")
    assert r.entry.sha256 == spec.sha256 and r.path.parent == folder
    assert temps(folder) == []


def test_temps_beside_a_joined_model_go_at_the_next_assembly(empty_home):
    # A temp planted beside an already-joined model (a join killed by an
    # older llmctl) goes too; another file's temp in the folder stays.
    from llmctl.store.pypi_parts import remove_join_temps

    spec = load_registry().get("gemma3-270m")
    r = resolve_model("gemma3-270m")
    ours = r.path.with_name(f".{r.path.name}.999999.0123abcd.tmp")
    other = r.path.with_name(".notes.txt.999999.0123abcd.tmp")
    for p in (ours, other):
        p.write_bytes(b"x" * 1024)
    assert remove_join_temps(r.path) == 1
    assert not ours.exists() and other.exists()
    assert r.entry.sha256 == spec.sha256

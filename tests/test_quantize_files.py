"""What `llmctl quantize` leaves on disk when it is killed or the machine
loses power: dead runs' temps are cleaned up, and the output is on disk
before it takes the final name."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from llmctl.cli.app import app


def quantize(model: Path, out: Path):
    # --allow-requantize: the bundled model is already Q4_1, and the
    # quickest real quantization there is.
    return CliRunner().invoke(app, ["quantize", str(model), "--bits", "8", "-o", str(out),
                                    "--allow-requantize", "--threads", "2"])


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def plant_temp(folder: Path, pid: int, token: str) -> Path:
    # The name llmctl.files.tmp_path gives, aged past clean_stale_tmp's minimum.
    path = folder / f".q8.gguf.{pid}.{token}.tmp"
    path.write_bytes(b"half a model")
    old = time.time() - 3600
    os.utime(path, (old, old))
    return path


def test_quantize_removes_dead_runs_temps_and_keeps_live_ones(tmp_path, model_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        stale = plant_temp(tmp_path, dead_pid(), "0123abcd")
        busy = plant_temp(tmp_path, live.pid, "4567cdef")
        r = quantize(model_path, tmp_path / "q8.gguf")
        assert r.exit_code == 0, r.output
        assert not stale.exists()
        assert busy.exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([busy.name, "q8.gguf"])
    finally:
        live.kill()
        live.wait()


def test_output_is_fsynced_before_it_is_renamed_into_place(tmp_path, model_path, monkeypatch):
    synced: list[str] = []
    renames: list[tuple[str, str, list[str]]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    def replace(src, dst, **kw):
        renames.append((str(src), str(dst), list(synced)))
        return real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    out = tmp_path / "q8.gguf"
    r = quantize(model_path, out)
    assert r.exit_code == 0, r.output
    [(temp, _, synced_before)] = [r for r in renames if r[1] == str(out)]
    assert Path(temp).parent == tmp_path and Path(temp).name.startswith(".q8.gguf.")
    assert temp in synced_before

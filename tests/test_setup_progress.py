"""scripts/_setup.sh's progress: one line per stage, measured from the
build's and pip's own output (canned here: a real build takes minutes), and
a set-up that has nothing to do stays silent."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import setup_progress as sp  # noqa: E402

NINJA_LINES = [
    "  *** Configuring CMake...\n",
    "  -- The C compiler identification is GNU 12.2.0\n",
    "  [1/83] /usr/bin/gcc -c ggml.c\n",
    "  [41/83] /usr/bin/g++ -c llama-model.cpp\n",
    "  [83/83] Linking CXX shared library libllama.so\n",
]


def feed(lines: list[str], units: int = 0) -> sp.Measure:
    m = sp.Measure(units)
    for line in lines:
        m.feed(line)
    return m


def test_build_steps_are_the_measure():
    m = feed(NINJA_LINES[:4])
    assert m.describe() == "49%"
    assert sp.status_line("[setup 2/3] building llama.cpp", m, 130) == (
        "[setup 2/3] building llama.cpp: 49% · 2m10s elapsed · about 2m left")
    assert feed(["[ 37%] Building CXX object x.o\n"]).describe() == "37%"
    assert feed(NINJA_LINES).fraction() == 1.0


def test_packages_count_against_the_units_with_download_bytes():
    lines = ["Collecting a-part1==0.2.0\n", "  Downloading a_part1-0.2.0.whl (50.0 MB)\n",
             "Progress 0 of 50000000\n", "Progress 50000000 of 50000000\n",
             "Collecting a-part2==0.2.0\n", "Progress 25000000 of 50000000\n"]
    assert feed(lines, units=4).describe() == "38%"          # 1.5 of 4
    assert feed(lines + ["Installing collected packages: a-part1, a-part2\n"],
                units=4).describe() == "100%"
    # Without a known total: what has been collected so far.
    assert feed(lines[:1] + lines[4:5]).describe() == "2 packages"


def test_time_left_waits_for_a_pace():
    assert sp.left(0.01, 100) == "" and sp.left(0.5, 2) == ""
    assert sp.left(0.5, 30) == "about 30s left"
    assert sp.left(0.25, 120) == "about 6m left"


def run_helper(tmp_path: Path, script: str, env: dict | None = None) -> subprocess.CompletedProcess:
    log = tmp_path / "setup.log"
    return subprocess.run(
        [sys.executable, str(REPO / "scripts/setup_progress.py"), "--stage", "2/3",
         "--label", "building", "--log", str(log), "--", sys.executable, "-c", script],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, **(env or {})})


def test_plain_output_is_a_few_lines_and_the_log_has_everything(tmp_path):
    script = "for i in range(1, 501): print(f'[{i}/500] cc -c f{i}.c')"
    r = run_helper(tmp_path, script)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert lines[0] == "[setup 2/3] building…"
    assert lines[-1].startswith("[setup 2/3] building: done in ")
    assert len(lines) <= 6
    log = (tmp_path / "setup.log").read_text()
    assert "[500/500] cc -c f500.c" in log and "[1/500]" in log


def test_a_failing_stage_shows_its_tail_and_keeps_its_status(tmp_path):
    script = "import sys\nfor i in range(100): print('line', i)\nprint('error: boom'); sys.exit(3)"
    r = run_helper(tmp_path, script)
    assert r.returncode == 3
    assert "building: failed in" in r.stderr
    assert "error: boom" in r.stderr and "line 99" in r.stderr
    assert "line 5\n" not in r.stderr                  # the tail only; the log has it all
    assert f"full log: {tmp_path / 'setup.log'}" in r.stderr


def test_quiet_prints_nothing_unless_it_fails(tmp_path):
    assert run_helper(tmp_path, "print('[1/2] x')", {"LLMCTL_SETUP_QUIET": "1"}).stderr == ""
    r = run_helper(tmp_path, "raise SystemExit(1)", {"LLMCTL_SETUP_QUIET": "1"})
    assert r.returncode == 1 and "failed" in r.stderr


def test_a_set_up_venv_is_silent_and_runs_no_pip(tmp_path):
    """With the stamp matching, the set-up only compares it: no pip (the
    fake venv has none), no build, no output."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    _copy_setup(repo)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    env = {**os.environ, "LLMCTL_VENV": str(venv), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "LLMCTL_EXTRAS": "test"}
    body = (repo / "scripts/_setup.sh").read_text()
    assert body.rstrip().endswith("\nsetup_main")
    (repo / "scripts/stamp.sh").write_text(body.rstrip().removesuffix("setup_main")
                                           + 'stamp_value test > "$(stamp_file test)"\n')
    subprocess.run(["bash", str(repo / "scripts/stamp.sh")], env=env, check=True, timeout=60)
    r = subprocess.run(["bash", "-c", f"source {repo}/scripts/_setup.sh && echo ready"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "ready\n", "")
    # The CLI's extras are covered by the test extras' stamp.
    env["LLMCTL_EXTRAS"] = "plot"
    r = subprocess.run(["bash", "-c", f"source {repo}/scripts/_setup.sh && echo ready"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "ready\n", "")


def _copy_setup(repo):
    (repo / "scripts").mkdir(parents=True, exist_ok=True)
    for name in ("_setup.sh", "setup_progress.py", "llama_cpp_slim.cmake", "llama_cpp_fa_rows.h",
                 "llama_cpp_fa_simd.h", "llama_cpp_tiled_rows.h", "llama_cpp_tiled_lanes.h",
                 "llama_cpp_q8k.h"):
        shutil.copy(REPO / "scripts" / name, repo / "scripts" / name)
    shutil.copy(REPO / "pyproject.toml", repo / "pyproject.toml")


def _wheel_key(repo, tmp_path) -> str:
    """The wheel-cache key _setup.sh computes for this copy of the repo."""
    body = (repo / "scripts/_setup.sh").read_text().rstrip().removesuffix("setup_main")
    (repo / "scripts/key.sh").write_text(body + 'echo "$KEY"\n')
    env = {**os.environ, "LLMCTL_VENV": str(tmp_path / "venv"),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = subprocess.run(["bash", str(repo / "scripts/key.sh")], env=env, capture_output=True,
                       text=True, timeout=60, check=True)
    return r.stdout.strip()


def test_the_wheel_key_follows_the_patches_content_not_their_path(tmp_path):
    """Every clone on a machine shares one wheel, and a changed hook or
    kernel builds a new one."""
    a, b = tmp_path / "a", tmp_path / "b"
    _copy_setup(a)
    _copy_setup(b)
    key = _wheel_key(a, tmp_path)
    assert len(key) == 16 and _wheel_key(b, tmp_path) == key
    for name in ("llama_cpp_slim.cmake", "llama_cpp_fa_rows.h", "llama_cpp_fa_simd.h",
                 "llama_cpp_tiled_rows.h", "llama_cpp_tiled_lanes.h", "llama_cpp_q8k.h"):
        with open(b / "scripts" / name, "a") as f:
            f.write("\n")
        changed = _wheel_key(b, tmp_path)
        assert changed != key
        key = changed


def test_the_build_skips_what_llmctl_never_loads():
    """llava/mtmd and llama-common are off."""
    setup = (REPO / "scripts/_setup.sh").read_text()
    assert "-DLLAVA_BUILD=OFF" in setup
    assert "-DCMAKE_PROJECT_llama.cpp_INCLUDE=$SLIM_CMAKE" in setup
    hook = (REPO / "scripts/llama_cpp_slim.cmake").read_text()
    assert "set(LLAMA_BUILD_COMMON OFF)" in hook


def test_the_display_redraws_in_place_on_a_terminal():
    out = io.StringIO()
    d = sp.Display("[setup 1/1] x", out, live=True, quiet=False)
    d.start()
    d.update(feed(NINJA_LINES[:3]), 3)
    d.finish(True, 4)
    assert out.getvalue().count("\r\x1b[K") == 2 and out.getvalue().endswith("x: done in 4s\n")

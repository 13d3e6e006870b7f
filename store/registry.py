"""models.toml: the names users can type, and where each one comes from."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from llmctl import config
from llmctl.errors import UsageError


@dataclass(frozen=True)
class RegistryModel:
    name: str
    repo: str
    file: str | None = None
    quant: str | None = None
    context: int = 4096
    template: str | None = None
    description: str = ""
    package: str | None = None
    package_file: str | None = None
    assemble: bool = False


@dataclass(frozen=True)
class Registry:
    default: str
    models: dict[str, RegistryModel]

    def get(self, name: str) -> RegistryModel | None:
        return self.models.get(name)


@lru_cache(maxsize=4)
def _load(path: Path, mtime: float) -> Registry:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"cannot read model registry {path}: {e}") from e
    models = {}
    for name, spec in data.get("models", {}).items():
        known = RegistryModel.__dataclass_fields__
        unknown = set(spec) - set(known)
        if unknown:
            raise UsageError(f"{path}: model {name!r} has unknown keys {sorted(unknown)}")
        models[name] = RegistryModel(name=name, **spec)
    return Registry(default=data.get("default", "smollm2"), models=models)


def load_registry() -> Registry:
    path = config.models_toml()
    try:
        mtime = path.stat().st_mtime
    except OSError as e:
        raise UsageError(f"model registry not found: {path}") from e
    return _load(path, mtime)

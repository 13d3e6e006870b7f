"""models.toml: the names users can type, and where each one comes from."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from llmctl import settings
from llmctl.errors import UsageError

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class RegistryModel:
    """One models.toml entry: the Hub repo and file or quant, context and
    template defaults, offline sources (a package or part packages, and the
    versions an install pins), the pinned sha256, the default draft and its
    kind (instruct or base)."""

    name: str
    repo: str
    file: str | None = None
    quant: str | None = None
    context: int = 4096
    template: str | None = None         # Jinja text over the GGUF's own (see _load)
    template_file: str | None = None    # ... read from store/templates/ (shipped)
    description: str = ""
    package: str | None = None
    package_file: str | None = None
    package_version: str | None = None  # the pin a first-use install of `package` uses
    parts: str | None = None
    parts_count: int = 0
    parts_file: str | None = None
    parts_version: str | None = None
    sha256: str | None = None
    draft: str | None = None            # registry name of a default draft model (--spec draft)
    kind: str = "instruct"              # "instruct" (chat-tuned) or "base" (no chat format)

    @property
    def offline(self) -> bool:
        """Whether installed PyPI packages can provide the file (no Hub)."""
        return bool(self.package or self.parts)

    def part_package(self, n: int) -> str:
        """The pip name of part `n` (1-based). Only for a model with `parts`."""
        assert self.parts is not None, f"{self.name} has no part packages"
        return self.parts.format(n=n)

    def part_file(self, n: int) -> str:
        """Part `n`'s file, relative to its package folder. Only for a model with `parts`."""
        assert self.parts_file is not None, f"{self.name} has no parts_file"
        return self.parts_file.format(n=n, i=n - 1)


@dataclass(frozen=True)
class Registry:
    """models.toml as read: the default model's name and the models by name."""

    default: str
    models: dict[str, RegistryModel]

    def get(self, name: str) -> RegistryModel | None:
        return self.models.get(name)


def _check_parts(path: Path, model: RegistryModel) -> None:
    # A typo here would otherwise surface only when a user resolves the
    # model, as a KeyError from str.format or a file that never matches.
    where = f"{path}: model {model.name!r}"
    if not (model.parts_file and model.parts_count > 0):
        raise UsageError(f"{where}: `parts` needs `parts_count` > 0 and `parts_file`")
    if not _SHA256_RE.match(model.sha256 or ""):
        raise UsageError(f"{where}: `parts` needs a pinned `sha256` (64 lowercase hex digits)")
    try:
        model.part_package(1), model.part_file(1)
    except (KeyError, IndexError, ValueError) as e:
        raise UsageError(f"{where}: bad placeholder in `parts` or `parts_file`: {e}") from e


_INT_KEYS = {"context", "parts_count"}
KINDS = ("instruct", "base")


def _check_keys(path: Path, name: str, spec: object) -> None:
    """A user's models.toml mistake is a UsageError naming the key, not a
    TypeError from deep inside a command."""
    where = f"{path}: model {name!r}"
    if not isinstance(spec, dict):
        raise UsageError(f"{where} must be a table of keys")
    unknown = set(spec) - set(RegistryModel.__dataclass_fields__) | ({"name"} & set(spec))
    if unknown:
        raise UsageError(f"{where} has unknown keys {sorted(unknown)}")
    if "repo" not in spec:
        raise UsageError(f"{where} needs `repo`, the Hugging Face repo id it comes from")
    if spec.get("kind", "instruct") not in KINDS:
        raise UsageError(f"{where}: `kind` must be one of {', '.join(KINDS)}")
    for key, value in spec.items():
        want = int if key in _INT_KEYS else str
        if not isinstance(value, want) or isinstance(value, bool):
            raise UsageError(f"{where}: `{key}` must be "
                             f"{'an integer' if want is int else 'a string'}")


@lru_cache(maxsize=4)
def _load(path: Path, mtime: float) -> Registry:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"cannot read model registry {path}: {e}") from e
    models = {}
    for name, spec in data.get("models", {}).items():
        _check_keys(path, name, spec)
        if "template_file" in spec:
            spec = {**spec, "template": _template_text(path, name, spec["template_file"])}
        models[name] = RegistryModel(name=name, **spec)
        if models[name].parts:
            _check_parts(path, models[name])
    return Registry(default=data.get("default", "smollm2"), models=models)


TEMPLATES = Path(__file__).resolve().parent / "templates"


def _template_text(path: Path, name: str, file: str) -> str:
    """A shipped template's text: a model's known template defect fixed
    (models.toml says which and why). Raises UsageError naming the key."""
    where = TEMPLATES / file
    if where.parent != TEMPLATES or not where.is_file():
        raise UsageError(f"{path}: model {name!r}: `template_file` {file!r} is not one of "
                         f"llmctl's templates ({TEMPLATES})")
    return where.read_text()


def load_registry() -> Registry:
    """models.toml (LLMCTL_MODELS_TOML or the shipped one), re-read when it
    changes. Raises UsageError when it is missing, unreadable or malformed."""
    path = settings.models_toml()
    try:
        mtime = path.stat().st_mtime
    except OSError as e:
        raise UsageError(f"model registry not found: {path}") from e
    return _load(path, mtime)

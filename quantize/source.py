"""What `MODEL` names for quantization: a GGUF file (store name, models.toml
name or path) or a Hugging Face safetensors directory (a path or a pulled
repo id)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmctl.errors import BadModelFile, ModelNotFound
from llmctl.quantize.hf_config import is_hf_dir


@dataclass
class SourceModel:
    kind: str           # "gguf" or "hf"
    name: str           # base of the store name: NAME:q4_k_m
    path: Path
    label: str          # what the registry entry records as the source

    @property
    def size(self) -> int:
        if self.path.is_file():
            return self.path.stat().st_size
        return sum(p.stat().st_size for p in self.path.glob("*.safetensors"))


def _store_name(text: str) -> str:
    return text.rstrip("/").split("/")[-1].split(":")[0].lower() or "model"


def _pulled_repo(ref: str) -> Path | None:
    if ref.count("/") != 1 or Path(ref).exists():
        return None
    from llmctl.hub import local_snapshot  # huggingface_hub is slow to import

    try:
        return local_snapshot(ref)
    except Exception:          # a malformed repo id is "not pulled", not a crash
        return None


def resolve_source(ref: str) -> SourceModel:
    from llmctl.store import resolve_model

    path = Path(ref).expanduser()
    if is_hf_dir(path):
        return SourceModel("hf", _store_name(str(path.resolve())), path, f"hf-dir:{path.resolve()}")
    snapshot = _pulled_repo(ref)
    if snapshot is not None:
        if not is_hf_dir(snapshot):
            raise BadModelFile(f"{ref}: the pulled repo has no config.json; "
                               "quantize one of its GGUF files instead")
        return SourceModel("hf", _store_name(ref), snapshot, f"hf:{ref}")
    if path.is_dir():
        raise BadModelFile(f"{path}: neither a GGUF file nor a Hugging Face model "
                           "directory (no config.json)")
    if path.exists() and not path.is_file():
        raise BadModelFile(f"{path}: not a regular file")
    resolved = resolve_model(ref)
    if not resolved.path.is_file():
        raise ModelNotFound(f"model file not found: {resolved.path}")
    is_store = resolved.entry is not None and resolved.name == ref
    label = f"store:{ref}" if is_store else f"file:{resolved.path.resolve()}"
    return SourceModel("gguf", _store_name(resolved.name), resolved.path, label)

"""Model metadata straight from a GGUF header, read with the `gguf` package."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path

from llmctl.errors import BadModelFile
from llmctl.store.gguf_header import read_header

GGUF_MAGIC = b"GGUF"
# Some architectures store head counts per layer, as arrays.
_PER_LAYER_KEYS = tuple(f"{a}.attention.{k}" for a in ("gemma3", "llama", "qwen2", "qwen3", "gemma2")
                        for k in ("head_count", "head_count_kv"))


@dataclass
class GGUFInfo:
    architecture: str
    name: str
    parameters: int
    quant: str
    context_length: int
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    chat_template: str | None
    size: int

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("chat_template")
        return d


def _quant_name(fields: dict) -> str:
    from gguf import LlamaFileType

    ftype = fields.get("general.file_type")
    if ftype is None:
        return "unknown"
    try:
        return LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_")
    except ValueError:
        return f"type{ftype}"


def check_magic(path: Path) -> None:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except FileNotFoundError as e:
        raise BadModelFile(f"{path}: no such file") from e
    except OSError as e:
        raise BadModelFile(f"{path}: cannot read: {e.strerror}") from e
    if magic != GGUF_MAGIC:
        raise BadModelFile(f"{path}: not a GGUF file")


def read_gguf_info(path: str | Path) -> GGUFInfo:
    """Parse the header; raise BadModelFile for non-GGUF or truncated files."""
    path = Path(path)
    check_magic(path)
    header = read_header(path, keep_arrays=_PER_LAYER_KEYS)
    size = path.stat().st_size
    if header.data_end > size:
        raise BadModelFile(f"{path}: truncated GGUF ({size} bytes, tensors need {header.data_end})")
    fields = header.metadata
    arch = fields.get("general.architecture") or "unknown"
    return GGUFInfo(
        architecture=arch,
        name=fields.get("general.name") or path.stem,
        parameters=header.n_elements,
        quant=_quant_name(fields),
        context_length=int(fields.get(f"{arch}.context_length") or 0),
        n_layers=int(fields.get(f"{arch}.block_count") or 0),
        n_embd=int(fields.get(f"{arch}.embedding_length") or 0),
        n_head=_scalar(fields.get(f"{arch}.attention.head_count")),
        n_head_kv=_scalar(fields.get(f"{arch}.attention.head_count_kv")),
        head_dim=int(fields.get(f"{arch}.attention.key_length") or 0)
        or int(fields.get(f"{arch}.embedding_length") or 0)
        // max(_scalar(fields.get(f"{arch}.attention.head_count")), 1),
        chat_template=fields.get("tokenizer.chat_template"),
        size=size,
    )


def _scalar(value) -> int:
    # Some architectures store per-layer head counts as arrays.
    if isinstance(value, (list, tuple)):
        return int(max(value)) if value else 0
    return int(value or 0)


def sha256_file(path: str | Path, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()

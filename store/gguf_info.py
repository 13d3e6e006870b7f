"""Model metadata straight from a GGUF header, read with the `gguf` package."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path

from llmctl.errors import BadModelFile

GGUF_MAGIC = b"GGUF"


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
    chat_template: str | None
    size: int

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("chat_template")
        return d


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    try:
        return field.contents()
    except Exception:  # malformed field in an otherwise readable file
        return default


def _quant_name(reader) -> str:
    from gguf import LlamaFileType

    ftype = _field(reader, "general.file_type")
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
    from gguf import GGUFReader

    path = Path(path)
    check_magic(path)
    try:
        reader = GGUFReader(path)
    except Exception as e:  # gguf raises ValueError/IndexError/struct errors
        raise BadModelFile(f"{path}: not a valid GGUF file (truncated or corrupt: {e})") from e
    size = path.stat().st_size
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise BadModelFile(f"{path}: truncated GGUF ({size} bytes, tensors need {end})")
    arch = _field(reader, "general.architecture", "unknown")
    return GGUFInfo(
        architecture=arch,
        name=_field(reader, "general.name", path.stem),
        parameters=sum(int(t.n_elements) for t in reader.tensors),
        quant=_quant_name(reader),
        context_length=int(_field(reader, f"{arch}.context_length", 0) or 0),
        n_layers=int(_field(reader, f"{arch}.block_count", 0) or 0),
        n_embd=int(_field(reader, f"{arch}.embedding_length", 0) or 0),
        n_head=_scalar(_field(reader, f"{arch}.attention.head_count", 0)),
        n_head_kv=_scalar(_field(reader, f"{arch}.attention.head_count_kv", 0)),
        chat_template=_field(reader, "tokenizer.chat_template"),
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

"""Model metadata straight from a GGUF header, and the GGUF facts other
modules share: split-file names, file-type names and the KV-cache size."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from llmctl.errors import BadModelFile
from llmctl.kv_types import KV_TYPES, kv_bytes_per_elem  # noqa: F401 (re-exported)
from llmctl.store.gguf_header import read_header

# llama.cpp's gguf-split naming: `<stem>-00001-of-00003.gguf`.
SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<idx>\d{5})-of-(?P<total>\d{5})\.gguf$", re.I)
# Some architectures store head counts per layer, as arrays.
_PER_LAYER_KEYS = tuple(f"{a}.attention.{k}" for a in ("gemma3", "llama", "qwen2", "qwen3", "gemma2")
                        for k in ("head_count", "head_count_kv"))


def split_stem(name: str) -> str | None:
    """The shared stem of a split GGUF's shards, or None for a whole file."""
    m = SPLIT_RE.match(name)
    return m.group("stem") if m else None


def is_later_shard(name: str) -> bool:
    """True for shards 2..n of a split GGUF: llama.cpp opens a split model by
    its first shard and finds the rest beside it."""
    m = SPLIT_RE.match(name)
    return m is not None and int(m.group("idx")) != 1


def file_type_name(ftype: int | None) -> str:
    """`general.file_type` as llama.cpp's ftype names spell it (`Q4_K_M`,
    `F16`), `unknown` when absent, `typeN` when unknown to gguf."""
    from gguf import LlamaFileType

    if ftype is None:
        return "unknown"
    try:
        return LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return f"type{ftype}"


def kv_cache_bytes(n_ctx: int, n_head_kv: int, head_dim: int, n_layers: int = 1,
                   bytes_per_elem: float = 2.0) -> int:
    """Bytes of KV cache: K and V, one row per token per KV head per layer
    (f16 unless told otherwise)."""
    return int(2 * n_layers * n_ctx * n_head_kv * head_dim * bytes_per_elem)


@dataclass
class GGUFInfo:
    """What llmctl reads of a GGUF: architecture, name, parameter count, quant,
    context length, layer and attention shape, chat template and file size."""

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

    def kv_cache_bytes(self, n_ctx: int, kv_type: str = "f16") -> int:
        """The whole model's KV cache at `n_ctx` tokens of `kv_type`.
        Raises ValueError for an unknown type."""
        return kv_cache_bytes(n_ctx, self.n_head_kv or self.n_head, self.head_dim,
                              self.n_layers, kv_bytes_per_elem(kv_type))


def read_gguf_info(path: str | Path) -> GGUFInfo:
    """Parse the header; raise BadModelFile for non-GGUF or truncated files."""
    path = Path(path)
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
        quant=file_type_name(fields.get("general.file_type")),
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

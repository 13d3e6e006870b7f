"""Read safetensors checkpoints by memory-mapping them: each tensor is a
numpy view into the page cache, so converting a model never holds more than
the tensor being written (plus, for Q/K, its permuted copy). numpy has no
bfloat16, so BF16 tensors come back as their raw uint16 bits."""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from llmctl.errors import BadModelFile

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


@dataclass
class TensorRef:
    name: str
    dtype: str            # safetensors spelling: F32, F16, BF16, ...
    shape: tuple[int, ...]
    file: Path
    start: int            # absolute byte offset in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def _read_header(path: Path) -> dict[str, TensorRef]:
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
    except (OSError, struct.error, ValueError) as e:
        raise BadModelFile(f"{path}: not a readable safetensors file") from e
    base = 8 + n
    refs = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        refs[name] = TensorRef(name, info["dtype"], tuple(info["shape"]), path,
                               base + start, base + end)
    return refs


def list_tensors(model_dir: Path) -> dict[str, TensorRef]:
    """Every tensor in a (possibly sharded) checkpoint, by name."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError) as e:
            raise BadModelFile(f"{index}: unreadable shard index") from e
        paths = [model_dir / f for f in files]
    else:
        paths = sorted(model_dir.glob("*.safetensors"))
    if not paths:
        raise BadModelFile(f"{model_dir}: no .safetensors weights found")
    refs: dict[str, TensorRef] = {}
    for path in paths:
        if not path.is_file():
            raise BadModelFile(f"{path}: shard listed in the index is missing")
        refs.update(_read_header(path))
    return refs


class TensorReader:
    """Maps each shard once and hands out zero-copy views."""

    def __init__(self):
        self._maps: dict[Path, mmap.mmap] = {}

    def view(self, ref: TensorRef) -> np.ndarray:
        if ref.dtype not in DTYPES:
            raise BadModelFile(f"tensor {ref.name} has dtype {ref.dtype}; "
                               f"supported: {', '.join(DTYPES)}")
        mm = self._maps.get(ref.file)
        if mm is None:
            with open(ref.file, "rb") as f:
                mm = self._maps[ref.file] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        dtype = np.dtype(DTYPES[ref.dtype])
        count = ref.nbytes // dtype.itemsize
        if ref.end > len(mm):
            raise BadModelFile(f"{ref.file}: truncated (tensor {ref.name} runs past the end)")
        return np.frombuffer(mm, dtype=dtype, count=count, offset=ref.start).reshape(ref.shape)

    def close(self) -> None:
        for mm in self._maps.values():
            try:
                mm.close()
            except BufferError:   # a view still alive; the GC closes it later
                pass
        self._maps.clear()

    def __enter__(self) -> "TensorReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def iter_refs(refs: dict[str, TensorRef]) -> Iterator[TensorRef]:
    # File order keeps reads sequential on disk.
    return iter(sorted(refs.values(), key=lambda r: (str(r.file), r.start)))

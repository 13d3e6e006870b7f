"""A fast GGUF header reader.

gguf's GGUFReader builds numpy objects for every metadata array, which takes
seconds on a 50k+ token vocabulary; we only need scalars, strings (the chat
template) and tensor shapes. So this reader walks a memory map of the header
once and skips arrays by offset. Type tables come from the `gguf` package so
sizes stay in step with upstream."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from llmctl.errors import BadModelFile

_SCALARS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
_U64 = struct.Struct("<Q")
GGUF_MAGIC = b"GGUF"


@dataclass
class TensorInfo:
    """One tensor of a GGUF header: name, shape (ne0 first), ggml type and
    offset in the data section."""

    name: str
    shape: tuple[int, ...]      # GGUF order: ne0 (row length) first
    type: int                   # ggml_type
    offset: int = 0             # relative to the data section

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def n_bytes(self) -> int:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.type)]
        return self.n_elements // block * size


@dataclass
class GGUFHeader:
    """A parsed GGUF header: version, metadata, tensor infos and where the
    data section starts."""

    path: Path
    version: int = 3
    metadata: dict[str, Any] = field(default_factory=dict)   # arrays only if asked for
    tensors: list[TensorInfo] = field(default_factory=list)
    data_offset: int = 0

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    @property
    def n_elements(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def data_end(self) -> int:
        return max((self.data_offset + t.offset + t.n_bytes for t in self.tensors),
                   default=self.data_offset)

    def tensor_type_names(self) -> set[str]:
        names = set()
        for t in self.tensors:
            try:
                names.add(GGMLQuantizationType(t.type).name)
            except ValueError:
                names.add(f"type{t.type}")
        return names


class _Cursor:
    """Reads by offset from the map: no per-field read() calls, which matters
    for 100k-entry vocabulary arrays."""

    def __init__(self, buf, keep_arrays: tuple[str, ...]):
        self.buf, self.pos, self.keep_arrays = buf, 0, keep_arrays

    def unpack(self, fmt: str):
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        end = self.unpack("<Q") + self.pos
        if end > len(self.buf):
            raise EOFError
        text = bytes(self.buf[self.pos:end]).decode("utf-8", "replace")
        self.pos = end
        return text

    def value(self, vtype: int, keep: bool = False):
        vtype = GGUFValueType(vtype)
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype != GGUFValueType.ARRAY:
            raise ValueError(f"unknown GGUF value type {vtype}")
        item, count = GGUFValueType(self.unpack("<I")), self.unpack("<Q")
        if keep:
            return [self.value(item) for _ in range(count)]
        if item in _SCALARS:
            self.pos += struct.calcsize(_SCALARS[item]) * count
        elif item == GGUFValueType.STRING:
            buf, pos, unpack = self.buf, self.pos, _U64.unpack_from
            for _ in range(count):
                pos += 8 + unpack(buf, pos)[0]
            self.pos = pos
        else:
            for _ in range(count):
                self.value(item)
        if self.pos > len(self.buf):
            raise EOFError
        return None


def _parse(cur: _Cursor, header: GGUFHeader) -> None:
    cur.pos = 4
    header.version = cur.unpack("<I")
    if header.version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {header.version}")
    n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
    for _ in range(n_kv):
        key = cur.string()
        value = cur.value(cur.unpack("<I"), keep=key in cur.keep_arrays)
        if value is not None:
            header.metadata[key] = value
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.unpack("<I")
        if n_dims > 8:
            raise ValueError(f"tensor {name!r} has {n_dims} dimensions")
        shape = tuple(cur.unpack("<Q") for _ in range(n_dims))
        ttype, offset = cur.unpack("<I"), cur.unpack("<Q")
        header.tensors.append(TensorInfo(name, shape, ttype, offset))
    align = int(header.metadata.get("general.alignment", 32) or 32)
    header.data_offset = cur.pos + (-cur.pos % align)


def check_magic(path: Path) -> None:
    """Cheap first look at a file the user named. Raises BadModelFile when it
    is missing, unreadable or does not start with the GGUF magic."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except FileNotFoundError as e:
        raise BadModelFile(f"{path}: no such file") from e
    except IsADirectoryError as e:
        raise BadModelFile(f"{path}: is a directory, not a GGUF file") from e
    except PermissionError as e:
        raise BadModelFile(f"{path}: cannot read: permission denied") from e
    except OSError as e:
        raise BadModelFile(f"{path}: cannot read: {e.strerror}") from e
    if magic != GGUF_MAGIC:
        raise BadModelFile(f"{path}: not a GGUF file")


def read_header(path: str | Path, keep_arrays: tuple[str, ...] = ()) -> GGUFHeader:
    """Parse magic, metadata and tensor infos, or raise BadModelFile naming
    the file. Arrays are skipped unless their key is in `keep_arrays`."""
    path = Path(path)
    check_magic(path)
    try:
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        header = GGUFHeader(path)
        with buf:
            _parse(_Cursor(buf, keep_arrays), header)
    except OSError as e:   # replaced or cut between the two opens
        raise BadModelFile(f"{path}: cannot read: {e.strerror or e}") from e
    except (EOFError, ValueError, struct.error, OverflowError, MemoryError) as e:
        raise BadModelFile(f"{path}: not a valid GGUF file (truncated or corrupt)") from e
    return header

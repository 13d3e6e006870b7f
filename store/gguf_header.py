"""A fast GGUF header reader.

gguf's GGUFReader builds numpy views for every metadata array, which takes
seconds on a vocabulary of 50k+ tokens; we only need scalars, the chat
template and tensor shapes. So this reader walks the header once, skips
arrays without materializing them, and borrows the type tables from the
`gguf` package so sizes stay in step with upstream."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

_SCALARS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
_MAX_STRING = 64 << 20      # a corrupt length must not make us allocate gigabytes


class HeaderError(ValueError):
    pass


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type: int
    offset: int             # relative to the data section

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
    version: int
    fields: dict[str, Any]
    tensors: list[TensorInfo]
    data_offset: int

    @property
    def data_end(self) -> int:
        return max((self.data_offset + t.offset + t.n_bytes for t in self.tensors),
                   default=self.data_offset)


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise HeaderError("unexpected end of file in the GGUF header")
    return data


def _unpack(f: BinaryIO, fmt: str):
    return struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]


def _string(f: BinaryIO) -> str:
    n = _unpack(f, "<Q")
    if n > _MAX_STRING:
        raise HeaderError(f"implausible string length {n}")
    return _read(f, n).decode("utf-8", errors="replace")


def _value(f: BinaryIO, vtype: int, keep_arrays: bool) -> Any:
    vtype = GGUFValueType(vtype)
    if vtype in _SCALARS:
        return _unpack(f, _SCALARS[vtype])
    if vtype == GGUFValueType.STRING:
        return _string(f)
    if vtype == GGUFValueType.ARRAY:
        item_type, count = GGUFValueType(_unpack(f, "<I")), _unpack(f, "<Q")
        if item_type in _SCALARS and not keep_arrays:
            f.seek(struct.calcsize(_SCALARS[item_type]) * count, 1)
            return None
        items = [_value(f, item_type, keep_arrays) for _ in range(count)]
        return items if keep_arrays else None
    raise HeaderError(f"unknown GGUF value type {vtype}")


def read_header(f: BinaryIO, keep_arrays: tuple[str, ...] = ()) -> GGUFHeader:
    """Parse magic, metadata and tensor infos. Arrays are skipped unless
    their key is in `keep_arrays` (small per-layer arrays, for example)."""
    if _read(f, 4) != b"GGUF":
        raise HeaderError("not a GGUF file")
    version = _unpack(f, "<I")
    if version not in (2, 3):
        raise HeaderError(f"unsupported GGUF version {version}")
    n_tensors, n_kv = _unpack(f, "<Q"), _unpack(f, "<Q")
    fields: dict[str, Any] = {}
    try:
        for _ in range(n_kv):
            key = _string(f)
            fields[key] = _value(f, _unpack(f, "<I"), key in keep_arrays)
        tensors = []
        for _ in range(n_tensors):
            name = _string(f)
            n_dims = _unpack(f, "<I")
            if n_dims > 8:
                raise HeaderError(f"tensor {name!r} has {n_dims} dimensions")
            shape = tuple(_unpack(f, "<Q") for _ in range(n_dims))
            ttype, offset = _unpack(f, "<I"), _unpack(f, "<Q")
            tensors.append(TensorInfo(name, shape, ttype, offset))
    except (ValueError, struct.error) as e:   # bad enum values included
        raise HeaderError(str(e)) from e
    align = int(fields.get("general.alignment", 32) or 32)
    pos = f.tell()
    data_offset = pos + (-pos % align)
    return GGUFHeader(version, fields, tensors, data_offset)

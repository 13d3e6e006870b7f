"""The prefix store's file format: the namespace a model and setting's
states live under, the hash chain that names a prefix, and a state file's
bytes. Its layout is documented in disk.py and docs/prefix-cache.md, and
must stay as it is: servers share these files across versions.

A state file (format 2) is `_HEAD` (magic, format, header length, payload
length, payload CRC32), a CRC32 over `_HEAD` and the header, the JSON header,
then the payload. The header's CRC is checked before its JSON is parsed; the
payload's when it is loaded. Format 1 files count as foreign."""

from __future__ import annotations

import array
import hashlib
import json
import struct
import zlib
from pathlib import Path

from llmctl.files import open_owned

BLOCK = 256
MAGIC = b"LLMCTLKV"
VERSION = 2
_HEAD = struct.Struct("<8sIIQI")    # magic, format, header length, payload length, payload crc32
_CRC = struct.Struct("<I")          # crc32 over _HEAD and the header
_MAX_HEADER = 64 << 20
FIXED_SIZE = _HEAD.size + _CRC.size     # bytes before the JSON header


def namespace(identity: dict[str, object]) -> str:
    """The folder name of a model and setting's states: 24 hex digits of
    the sha256 of `identity` as JSON with sorted keys."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def block_chain(ns: str, tokens: list[int], n_blocks: int) -> list[str]:
    """Hash of each block-aligned prefix: block i's hash covers all before it."""
    h = hashlib.sha256(ns.encode()).digest()
    out = []
    for i in range(n_blocks):
        block = array.array("i", tokens[i * BLOCK:(i + 1) * BLOCK]).tobytes()
        h = hashlib.sha256(h + block).digest()
        out.append(h.hex()[:32])
    return out


def state_prefix(header: bytes, payload: bytes | memoryview) -> bytes:
    """The bytes a state file starts with, before `header` (JSON) and `payload`."""
    head = _HEAD.pack(MAGIC, VERSION, len(header), len(payload), zlib.crc32(payload))
    return head + _CRC.pack(zlib.crc32(header, zlib.crc32(head)))


def read_state(path: Path, payload: bool = False) -> tuple[bytes, int, int, bytes] | None:
    """(raw header, header CRC, payload length, payload or b"" unless asked)
    of a state file of ours, each part read checked against its CRC; None
    when no regular file of ours is there. Raises ValueError when it is not a
    whole state file of this format, OSError when it cannot be read."""
    opened = open_owned(path)
    if opened is None:
        return None
    with opened[0] as f:
        fixed = f.read(FIXED_SIZE)
        if len(fixed) != FIXED_SIZE:
            raise ValueError("shorter than a header")
        magic, version, hlen, plen, pcrc = _HEAD.unpack_from(fixed)
        if magic != MAGIC or version != VERSION:
            raise ValueError("not a state file of this format")
        if hlen > _MAX_HEADER or opened[1] != len(fixed) + hlen + plen:
            raise ValueError("truncated or padded")
        raw = f.read(hlen)
        (crc,) = _CRC.unpack_from(fixed, _HEAD.size)
        if len(raw) != hlen or zlib.crc32(raw, zlib.crc32(fixed[:_HEAD.size])) != crc:
            raise ValueError("header checksum mismatch")
        data = f.read(plen) if payload else b""
    if payload and (len(data) != plen or zlib.crc32(data) != pcrc):
        raise ValueError("payload checksum mismatch")
    return raw, crc, plen, data


def decode_header(raw: bytes) -> dict:
    """The header's fields, type-checked. Raises ValueError otherwise."""
    try:
        header = json.loads(raw)
    except RecursionError as e:
        raise ValueError("header nested too deeply") from e
    if not (isinstance(header, dict) and isinstance(header.get("ns"), str)
            and type(header.get("n_tokens")) is int
            and isinstance(header.get("tokens"), list)
            and all(type(t) is int for t in header["tokens"])
            and isinstance(header.get("chain"), list)
            and all(isinstance(h, str) for h in header["chain"])):
        raise ValueError("header fields missing or of the wrong type")
    return header


def read_header(path: Path) -> tuple[dict, int, int] | None:
    """(header, header length, payload length), or None when the file is not
    a whole state file of ours. Raises OSError when it cannot be read."""
    try:
        state = read_state(path)
        return None if state is None else (decode_header(state[0]), len(state[0]), state[2])
    except ValueError:
        return None

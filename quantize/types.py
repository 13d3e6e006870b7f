"""Quantization type names. The list comes from llama.cpp's own ftype enum as
the binding exposes it, so every type the library can write is accepted and
no other."""

from __future__ import annotations

from dataclasses import dataclass

from llmctl.errors import UsageError

# Every type name the linked llama.cpp can write, with its ftype.
from llmctl.runtime.llama import file_types as available_types

BITS_TO_TYPE = {4: "Q4_K_M", 8: "Q8_0"}

# Full-precision file types: quantizing from these loses nothing twice.
FLOAT_TYPES = {"F32", "F16", "BF16"}


@dataclass(frozen=True)
class QuantType:
    name: str      # e.g. "Q4_K_M"
    ftype: int     # llama_ftype value

    @property
    def tag(self) -> str:
        """The store-name suffix: `NAME:q4_k_m`."""
        return self.name.lower()


def resolve_type(bits: int | None, type_name: str | None) -> QuantType:
    """`--type` wins over `--bits`; one of them is required. Raises
    UsageError for an unknown type, bits other than 4 or 8, or neither."""
    types = available_types()
    if type_name:
        key = type_name.strip().upper().replace("-", "_")
        if key not in types:
            raise UsageError(f"unknown quantization type {type_name!r}; "
                             f"choose one of: {', '.join(sorted(types))}", param="type")
        return QuantType(key, types[key])
    if bits is None:
        raise UsageError("give --bits 4|8 or --type TYPE", param="bits")
    if bits not in BITS_TO_TYPE:
        raise UsageError(f"--bits must be 4 or 8, not {bits} (use --type for others)",
                         param="bits")
    name = BITS_TO_TYPE[bits]
    return QuantType(name, types[name])

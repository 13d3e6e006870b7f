"""Disk-space estimates for quantized files; llmctl.files.require_space
checks them before writing, so a full disk fails fast with a clear message
instead of mid-file."""

from __future__ import annotations

_MARGIN = 1.10
_SLACK = 16 << 20      # metadata, alignment, filesystem overhead


def _bpw(type_name: str) -> float:
    """Bits per weight of a file type's main tensor type. K-quant mixes put
    some tensors one or two steps higher, hence the margin in `estimate`."""
    import gguf

    base = type_name.upper()
    for suffix in ("_S", "_M", "_L", "_XS", "_XXS"):
        if base.endswith(suffix) and base[: -len(suffix)] in gguf.GGMLQuantizationType.__members__:
            base = base[: -len(suffix)]
            break
    if base == "MXFP4_MOE":
        base = "MXFP4"
    try:
        qtype = gguf.GGMLQuantizationType[base]
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        return 8.0 * size / block
    except KeyError:
        return 16.0


def estimate_bytes(n_elements: int, type_name: str) -> int:
    """Upper bound on the size of a `type_name` file of `n_elements` weights."""
    # Mixes (Q4_K_M keeps some tensors at Q6_K) can exceed the main type.
    bpw = min(32.0, _bpw(type_name) + 2.0)
    return int(n_elements * bpw / 8 * _MARGIN) + _SLACK

"""KV-cache element types, in a module with no imports so that the CLI's
option declarations can list them without slowing start-up."""

# The KV-cache element types llmctl offers, with their bytes per element:
# ggml's q8_0 stores 32 int8 values and one f16 scale per block (34 bytes
# per 32), q4_0 32 nibbles and a scale (18 bytes per 32).
KV_TYPES: dict[str, float] = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


def kv_bytes_per_elem(kv_type: str) -> float:
    """Bytes per cached element of `kv_type`. Raises ValueError for a type
    llmctl does not offer, naming the ones it does."""
    try:
        return KV_TYPES[kv_type]
    except KeyError:
        raise ValueError(f"unknown KV cache type {kv_type!r}: use one of "
                         + ", ".join(KV_TYPES)) from None

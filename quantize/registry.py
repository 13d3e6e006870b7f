"""Index a quantized file in the store, recording where it came from."""

from __future__ import annotations

from pathlib import Path

from llmctl.store.index import ModelEntry, StoreIndex


def register_result(name: str, path: Path, *, source: str, quant_type: str,
                    owned: bool = True, extra: dict | None = None) -> ModelEntry:
    return StoreIndex().register_file(
        name, path, source=source, owned=owned,
        extra={"quant_type": quant_type, "quantized_from": source, **(extra or {})})

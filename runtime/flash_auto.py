"""`--flash-attn auto` while the prefix cache is on: measured per model and
machine, not assumed.

Flash attention off buys one thing: where this CPU computes a row the same
alone and in a batch, a request's greedy answer does not depend on the
requests beside it or on a prefix-cache hit. Where it does not (an EPYC
measured 0.3-0.8 apart in logits, docs/exactness.md), off buys nothing:
answers already depend on batching, while on is faster and its tile rule
keeps prefix hits exact in the same company (prefix_cache/rule.py). So
auto keeps it off only where off measures exact. The measurement takes a
fraction of a second on the loaded model and is stored per model file,
llama.cpp build, CPU and thread count (exactness.measure_rows)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from llmctl.runtime.config import LoadOptions
from llmctl.runtime.llama import LlamaModel
from llmctl.runtime.llama.exactness import measure_rows

log = logging.getLogger("llmctl.flash_attn")

STORE_NAME = "exactness.json"


def resolve_flash_attn(opts: LoadOptions, model: LlamaModel, threads: int, n_gpu_layers: int,
                       cache_dir: Path) -> tuple[LoadOptions, str]:
    """`opts` with flash attention decided, and why, in a few words. Only
    the undecided case is measured: auto with the prefix cache on, an f16
    KV and the model on the CPU (a GPU's kernels are not the ones measured,
    so there the static rule holds: off). Raises DecodeError and
    LlmctlError from the measurement's context."""
    if opts.flash_attn is not None:
        return opts, "set"
    if not opts.prefix_cache or opts.kv_type != "f16" or n_gpu_layers:
        return opts, "auto"
    rows = measure_rows(model.path, flash_attn=False, threads=threads, model=model,
                        store=cache_dir / STORE_NAME)
    if rows.exact:
        why = "off: rows measured exact with it off, so answers do not depend on batching"
    else:
        why = (f"on: rows with it off measured {rows.max_logit_diff:.3g} apart in logits on this "
               "CPU, so off buys no exactness")
    log.info("flash attention %s", why)
    return dataclasses.replace(opts, flash_attn=not rows.exact), why

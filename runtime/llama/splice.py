"""Splicing a sequence's KV: runs of cells moved to new positions, with new
tokens computed in the gaps before them, for prefix_cache/reuse.py.

llama.cpp computes a sequence's new tokens only right after its last
position, so the engine's contexts (one KV stream per sequence) cannot fill
a gap before cells they keep. A small context with a unified KV can: there
a cell may belong to two sequences, so the kept runs wait in sequence 1,
moved to their new positions, while sequence 0 computes each gap after the
prefix and takes the next run back. The spliced sequence then goes back to
the engine's slot as a state, a memory copy. The gap tokens attend to the
prefix and the earlier gaps and runs, exactly as in a cold prefill; only the
runs' own KV is the old one (computed after the old gap).

The context is made on first use and kept; it holds one sequence's worth
of cells and a margin for the gaps.

A sequence's state names how many KV streams its cache had, and llama.cpp
refuses a state whose count differs from its own ("n_stream mismatch"). An
engine of 16 slots has 16 streams and the splice context one, so states are
re-headed on the way in and out (`restream`): without that, moving only
ever worked for an engine of one slot."""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

from llmctl.errors import LlmctlError
from llmctl.runtime.llama.context import ContextConfig, LlamaContext
from llmctl.runtime.llama.model import LlamaModel

# llama_state_seq_get_data's header before the KV's own state: a magic and
# the sequence id (llama-context.cpp's state_seq_write_data).
HEAD = 8


@dataclass(frozen=True)
class Move:
    """Cells at `src`..`src + n` that belong at `dst`."""

    src: int
    dst: int
    n: int


class Splicer:
    """Splices states for contexts shaped like `cfg` (same model, KV type and
    attention); `margin` bounds the gap tokens of one splice; `min_run` is
    the shortest run worth moving (prefix_cache/reuse.py's)."""

    def __init__(self, model: LlamaModel, cfg: ContextConfig, min_run: int, margin: int = 1024):
        self.model = model
        self.min_run = min_run
        self.margin = margin
        self.cfg = replace(cfg, n_ctx_seq=cfg.n_ctx_seq + margin, n_seq_max=2, kv_unified=True)
        self.n_stream = 1 if cfg.kv_unified else cfg.n_seq_max    # the engine context's
        self._ctx: LlamaContext | None = None

    def splice(self, state: bytes | memoryview, prompt: list[int], prefix: int,
               runs: list[Move]) -> tuple[memoryview, int]:
        """The state of `prompt`'s first tokens, from `state` (an old
        sequence's): its first `prefix` cells kept, each run moved to `dst`
        and the prompt's tokens between them computed. Returns (the new
        state, how many prompt tokens it holds). Raises DecodeError and
        LlmctlError (a state llama.cpp refuses, or gaps over the margin)."""
        gaps = sum(r.dst for r in runs) - sum(r.dst + r.n for r in runs[:-1]) - prefix
        if gaps > self.margin:
            raise LlmctlError(f"the gaps hold {gaps} tokens, over the splice margin")
        ctx = self._context()
        ctx.clear()
        try:
            if not ctx.state_set(restream(state, 1), 0):
                raise LlmctlError("llama.cpp refused the state to splice")
            for r in runs:
                ctx.seq_cp(0, 1, r.src, r.src + r.n)
            ctx.seq_rm(0, prefix, -1)
            for r in _in_safe_order(runs):
                ctx.seq_add(1, r.src, r.src + r.n, r.dst - r.src)
            at = prefix
            for r in runs:
                ctx.prefill(0, prompt[at:r.dst], at)
                ctx.seq_cp(1, 0, r.dst, r.dst + r.n)
                at = r.dst + r.n
            # One token more: a decode applies the pending shifts, and the
            # runs never cover the prompt's last token, so it exists.
            ctx.prefill(0, prompt[at:at + 1], at)
            ctx.seq_rm(1, -1, -1)
            return memoryview(restream(ctx.state_get(0), self.n_stream)), at + 1
        finally:
            ctx.clear()

    def _context(self) -> LlamaContext:
        if self._ctx is None:
            self._ctx = LlamaContext(self.model, self.cfg)
        return self._ctx

    def close(self) -> None:
        """Free the context, if one was made."""
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None


def _in_safe_order(runs: list[Move]) -> list[Move]:
    """The runs in an order whose shifts never land on cells not yet moved:
    those moving left first, left to right, then those moving right, right
    to left (runs keep their order, so each lands where the cells it could
    meet have already left)."""
    left = [r for r in runs if r.dst < r.src]
    right = [r for r in runs if r.dst > r.src]
    return left + right[::-1]


def restream(state: bytes | memoryview, n_stream: int) -> bytes | memoryview:
    """One sequence's KV state (llama_state_seq_get_data of a plain KV
    cache) re-headed for a cache of `n_stream` streams. The state is a
    magic and the sequence id, the stream count, then per stream a cell
    count and, when not 0, its cells; one sequence's cells are all in one
    stream, and llama.cpp reads them into the destination sequence's own
    stream whichever record holds them. Raises LlmctlError for a state
    that cannot be one sequence's. A sliding-window model's state holds two
    caches' back to back; the second keeps its old count, so llama.cpp
    refuses it and that prompt is prefilled plainly."""
    view = memoryview(state).cast("B")
    if len(view) < HEAD + 4:
        raise LlmctlError("a KV state too short to hold its stream count")
    (have,) = struct.unpack_from("<I", view, HEAD)
    if have == n_stream:
        return state
    first = HEAD + 4            # the first stream's cell count
    if have == 0 or len(view) < first + 4 * have:
        raise LlmctlError(f"a KV state of {have} streams and {len(view)} bytes")
    i = 0
    while i < have - 1 and struct.unpack_from("<I", view, first + 4 * i)[0] == 0:
        i += 1
    end = len(view) - 4 * (have - 1 - i)    # the streams after it: a count of 0 each
    if end < first + 4 * i + 4 or any(view[end:]):
        raise LlmctlError("a KV state whose cells span several streams")
    return b"".join((view[:HEAD], struct.pack("<I", n_stream), view[first + 4 * i:end],
                     bytes(4 * (n_stream - 1))))

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
of cells and a margin for the gaps."""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmctl.errors import LlmctlError
from llmctl.runtime.llama.context import ContextConfig, LlamaContext
from llmctl.runtime.llama.model import LlamaModel


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
            if not ctx.state_set(state, 0):
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
            return ctx.state_get(0), at + 1
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

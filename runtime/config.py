"""The one set of options a model is loaded and served with, validated once
here; the engine, the scheduler and the prefix cache read their parts of it."""

from __future__ import annotations

from dataclasses import dataclass

from llmctl.errors import UsageError
from llmctl.runtime import planner


@dataclass(frozen=True)
class LoadOptions:
    """How to load and run a model. Raises UsageError on construction when a
    value is out of range, so every front end reports the same message."""

    ctx_size: int | None = None          # tokens per sequence; None: the model's, capped
    threads: int | None = None
    n_gpu_layers: str | int = "auto"
    max_num_seqs: int = 1
    max_num_batched_tokens: int = 512
    max_queue: int = 256
    flash_attn: bool | None = None       # None: on unless the prefix cache is on
    prefix_cache: bool = True
    prefix_cache_size_gb: float = 4.0

    def __post_init__(self) -> None:
        if self.ctx_size is not None and self.ctx_size < 64:
            raise UsageError("ctx_size must be at least 64 tokens")
        if self.threads is not None and self.threads < 1:
            raise UsageError("threads must be >= 1")
        if self.max_num_seqs < 1:
            raise UsageError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens <= self.max_num_seqs:
            raise UsageError("max_num_batched_tokens must exceed max_num_seqs: every step "
                             "feeds one token per running sequence plus prompt chunks")
        if self.max_queue < 0:
            raise UsageError("max_queue must be >= 0")
        try:
            planner.parse_gpu_layers(self.n_gpu_layers)
        except ValueError as e:
            raise UsageError(f"invalid n_gpu_layers {self.n_gpu_layers!r}: use auto or a number") from e

    @property
    def use_flash_attn(self) -> bool:
        """The one flash-attention decision, read by the engine's context and
        by the disk prefix cache's key alike.

        CPU flash attention picks its kernel by how many query rows a chunk
        has, so a token's logits depend on how its prompt was split; a prefix
        hit could then change greedy output. So it is off by default while
        the cache is on (bit-exact hits); on is faster but hits may differ."""
        return self.flash_attn if self.flash_attn is not None else not self.prefix_cache


@dataclass(frozen=True)
class EngineShape:
    """What the engine needs beyond LoadOptions, resolved from the model."""

    n_ctx_seq: int
    n_threads: int

"""The one set of options a model is loaded and served with, validated once
here; the engine, the scheduler and the prefix cache read their parts of it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from llmctl.errors import UsageError
from llmctl.kv_types import KV_TYPES
from llmctl.runtime import planner
from llmctl.runtime.batching import CPU_STEP_TOKENS, ENGINE_MAX_QUEUE, GPU_STEP_TOKENS
from llmctl.runtime.prefix_cache.rule import tile_for
from llmctl.runtime.speculation.spec_config import DRAFT_MIN, P_MIN, SpecConfig, default_draft_max
from llmctl.settings import Settings


@dataclass(frozen=True)
class LoadOptions:
    """How to load and run a model. Raises UsageError on construction when a
    value is out of range, so every front end reports the same message."""

    ctx_size: int | None = None          # tokens per sequence; None: the model's, capped
    threads: int | None = None
    n_gpu_layers: str | int = "auto"
    max_num_seqs: int = 1
    # One step's tokens; None: 512 on a CPU, 2048 with every layer on a GPU
    # (on_device), where a bigger step costs little more than a small one.
    max_num_batched_tokens: int | None = None
    max_queue: int = ENGINE_MAX_QUEUE
    # None: on with every layer on a GPU (on_device), under deterministic
    # and for a quantized KV; on a CPU, on unless the prefix cache is on.
    flash_attn: bool | None = None
    # ggml's repacked layouts of quantized weights, whose one-row and
    # many-row kernels round a row differently: off, so that greedy answers
    # never depend on the batch (docs/exactness.md); on, 1.2x faster at 15-16
    # sequences of a K-quant 1.5B on 2 cores, and no faster elsewhere.
    repack: bool = False
    # The default is exact (flash attention on, weights in their file's
    # layout); --deterministic is kept for scripts, and refuses the settings
    # that are not (repacked weights, flash attention off).
    deterministic: bool = False
    # Sampling in llama.cpp's graph, so that only the chosen token leaves the
    # device, for the requests whose chain it supports (sampler.py's
    # backend_eligible). None: on with every layer on a GPU (on_device).
    backend_sampling: bool | None = None
    prefix_cache: bool = True
    prefix_cache_size_gb: float = 4.0
    move_cached_runs: int = 0            # prefix_cache/reuse.py's min_run; 0: exact prefixes only
    # Speculation: "auto" (n-gram guesses where they pay, the default),
    # None (off), "ngram" (prompt lookup, always) or "draft" (a draft model:
    # `draft`, else the registry's default draft for the model); naming a
    # draft alone, or with auto, means "draft". Guesses per step.
    spec: str | None = "auto"
    draft: str | None = None
    draft_max: int | None = None         # None: the mode's default (default_draft_max)
    draft_min: int = DRAFT_MIN
    draft_p_min: float = P_MIN
    kv_type: str = "f16"                 # K and V cache element type: a KV_TYPES name
    # The bounds without a flag (engine stall, grammar budget, embeddings,
    # model waiters): Settings.load()'s, read once by the front end.
    settings: Settings = field(default_factory=Settings)

    def __post_init__(self) -> None:
        if self.ctx_size is not None and self.ctx_size < 64:
            raise UsageError("ctx_size must be at least 64 tokens")
        if self.threads is not None and self.threads < 1:
            raise UsageError("threads must be >= 1")
        if self.max_num_seqs < 1:
            raise UsageError("max_num_seqs must be >= 1")
        if self.step_tokens <= self.max_num_seqs:
            raise UsageError("max_num_batched_tokens must exceed max_num_seqs: every step "
                             "feeds one token per running sequence plus prompt chunks")
        if self.max_queue < 0:
            raise UsageError("max_queue must be >= 0")
        if self.move_cached_runs < 0:
            raise UsageError("move_cached_runs must be >= 0")
        try:
            planner.parse_gpu_layers(self.n_gpu_layers)
        except ValueError as e:
            raise UsageError(f"invalid n_gpu_layers {self.n_gpu_layers!r}: use auto or a number") from e
        self._check_kv_type()
        if self.deterministic and self.flash_attn is False:
            raise UsageError("--deterministic needs flash attention: leave --flash-attn at auto "
                             "or on")
        if self.deterministic and self.repack:
            raise UsageError("--deterministic and --repack: repacked weights round a row by "
                             "its batch; drop one")
        try:
            _ = self.spec_config
        except ValueError as e:
            raise UsageError(f"speculation: {e}") from None
        if self.draft is not None and self.spec == "ngram":
            raise UsageError("--draft names a draft model, which --spec ngram does not use; "
                             "use --spec draft (or leave --spec out)")

    @property
    def step_tokens(self) -> int:
        """One step's token budget (a CPU's default until on_device)."""
        return self.max_num_batched_tokens or CPU_STEP_TOKENS

    def on_device(self, offloaded: bool) -> "LoadOptions":
        """These options with their automatic values settled for where the
        model runs: `offloaded` means every layer is on a GPU. There, a
        step of 2,048 tokens, flash attention (faster on CUDA at every
        size: docs/measurements.md, "CUDA") and backend sampling; on a
        CPU, the defaults above."""
        changes: dict = {}
        if self.max_num_batched_tokens is None:
            changes["max_num_batched_tokens"] = GPU_STEP_TOKENS if offloaded else CPU_STEP_TOKENS
        if self.flash_attn is None and offloaded:
            changes["flash_attn"] = True
        if self.backend_sampling is None:
            changes["backend_sampling"] = offloaded
        return replace(self, **changes) if changes else self

    @property
    def spec_config(self) -> SpecConfig:
        """The speculation settings. Raises ValueError for bad values."""
        mode = "draft" if self.draft and self.spec in (None, "auto") else self.spec
        draft_max = default_draft_max(mode) if self.draft_max is None else self.draft_max
        return SpecConfig(mode, draft_max, self.draft_min, self.draft_p_min)

    def _check_kv_type(self) -> None:
        if self.kv_type not in KV_TYPES:
            raise UsageError(f"invalid kv_type {self.kv_type!r}: use one of {', '.join(KV_TYPES)}")
        # llama.cpp reads a quantized V only inside its flash-attention
        # kernel; refusing here beats quietly running another type than asked.
        if self.kv_type != "f16" and self.flash_attn is False:
            raise UsageError(f"kv_type {self.kv_type}: a quantized V cache needs flash attention; "
                             "use --flash-attn on or auto")

    @property
    def use_flash_attn(self) -> bool:
        """The one flash-attention decision, read by the engine's context and
        by the disk prefix cache's key alike: on unless turned off.

        On a CPU it is the exact kernel: llmctl's build computes each query
        row alone over its KV, in order, in a chunk of any size
        (scripts/llama_cpp_fa_rows.h: as fast as attention without flash
        attention over a long KV, and within a few percent of ggml's tiled
        kernel at a 512-row chunk; the split-KV kernel a lone decode row
        took past 512 cells is off). Without it, one query row and several
        are multiplied by different kernels, so logits depend on the batch
        (docs/exactness.md), and prefills and many short requests are
        slower (docs/measurements.md, "Batch invariance")."""
        return True if self.flash_attn is None else self.flash_attn

    @property
    def prompt_tile(self) -> int:
        """The one tile rule (prefix_cache/rule.py), read by the scheduler's
        cuts and the prefix cache's reuse alike, so the two never disagree."""
        from llmctl.runtime.llama.library import has_fa_rows_kernel

        # A quantized KV takes ggml's own per-row kernel at every chunk size.
        per_row = self.kv_type != "f16" or has_fa_rows_kernel()
        return tile_for(self.use_flash_attn, not self.repack, per_row)


@dataclass(frozen=True)
class EngineShape:
    """What the engine needs beyond LoadOptions, resolved from the model."""

    n_ctx_seq: int
    n_threads: int

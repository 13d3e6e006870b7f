"""An engine assembled from its parts, in the order they depend on each
other: the generation context first (llama.cpp may round its size up), then
the splicer shaped like it, the prefix cache keyed by that context, the
proposer sized like it, then the engine that runs them. Each part is built whole from explicit
values; a part that fails closes the ones made before it."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from llmctl.runtime.engine.loop import Engine
from llmctl.runtime.llama import ContextConfig, LlamaContext, LlamaModel, Splicer
from llmctl.runtime.load_options import EngineShape, LoadOptions
from llmctl.runtime.prefix_cache.cache import KvLayout, PrefixCache, Weights, open_prefix_cache
from llmctl.runtime.speculation.draft import Drafter
from llmctl.runtime.speculation.ngram import NgramProposer
from llmctl.runtime.speculation.proposer import Proposer


def context_config(opts: LoadOptions, shape: EngineShape) -> ContextConfig:
    """The engine's generation context: one KV stream per slot."""
    return ContextConfig(n_ctx_seq=shape.n_ctx_seq, n_seq_max=opts.max_num_seqs,
                         n_batch=opts.step_tokens, n_threads=shape.n_threads,
                         flash_attn=opts.use_flash_attn, kv_type=opts.kv_type)


def splicer_for(opts: LoadOptions, ctx: LlamaContext, shape: EngineShape) -> Splicer | None:
    """The splicer that moves cached runs past a difference, where the
    prefix cache is on, `opts` asks for moves and the context can shift."""
    if not opts.prefix_cache or opts.move_cached_runs <= 0 or not ctx.can_shift:
        return None
    return Splicer(ctx.model, context_config(opts, shape), opts.move_cached_runs)


def prefix_cache_for(opts: LoadOptions, ctx: LlamaContext, weights: Weights,
                     root: Path, min_run: int) -> PrefixCache | None:
    """The prefix cache `opts` asks for (None when off), its disk store
    under `root` keyed by `weights` and the context's KV layout; `min_run`
    is the splicer's (0: no moves). Raises OSError when the weights cannot
    be read for their fingerprint."""
    if not opts.prefix_cache:
        return None
    flash_attn = opts.use_flash_attn
    kv = KvLayout(n_ctx_seq=ctx.n_ctx_seq, n_seq_max=opts.max_num_seqs,
                  kv_type=opts.kv_type, flash_attn=flash_attn, repack=opts.repack,
                  tile=opts.prompt_tile)
    return open_prefix_cache(weights, kv, root=root,
                             budget_bytes=int(opts.prefix_cache_size_gb * 1e9),
                             tile=opts.prompt_tile, min_run=min_run)


def proposer_for(opts: LoadOptions, ctx: LlamaContext, shape: EngineShape,
                 draft_model: LlamaModel | None) -> Proposer | None:
    """The proposer of `opts`' speculation mode (None when off). A draft
    model's context mirrors the target's slots and sizes. Raises what
    LlamaContext raises for the draft's context."""
    spec = opts.spec_config
    if spec.mode in ("auto", "ngram"):
        return NgramProposer()
    if spec.mode != "draft" or draft_model is None:
        return None
    cfg = ContextConfig(n_ctx_seq=ctx.n_ctx_seq, n_seq_max=opts.max_num_seqs,
                        n_batch=opts.step_tokens, n_threads=shape.n_threads,
                        flash_attn=opts.use_flash_attn)
    return Drafter(draft_model, cfg, spec.p_min, spec.draft_min)


def start_engine(model: LlamaModel, opts: LoadOptions, shape: EngineShape, *,
                 weights: Weights, cache_root: Path,
                 draft_model: LlamaModel | None = None) -> Engine:
    """A running engine for `model`, with the prefix cache and the proposer
    `opts` ask for; the engine owns them and its context from here on.
    `weights` and `cache_root` key and place the disk prefix store. Raises
    what making a context raises and OSError from the prefix cache;
    nothing is left open then."""
    with ExitStack() as undo:
        ctx = LlamaContext(model, context_config(opts, shape))
        undo.callback(ctx.close)
        splicer = splicer_for(opts, ctx, shape)
        if splicer is not None:
            undo.callback(splicer.close)
        cache = prefix_cache_for(opts, ctx, weights, cache_root,
                                 splicer.min_run if splicer else 0)
        if cache is not None:
            undo.callback(cache.close)
        proposer = proposer_for(opts, ctx, shape, draft_model)
        if proposer is not None:
            undo.callback(proposer.close)
        engine = Engine(model, ctx, opts, prefix_cache=cache, proposer=proposer,
                        splicer=splicer)
        undo.pop_all()
    return engine

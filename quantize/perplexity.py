"""Perplexity the way llama.cpp's `llama-perplexity` measures it: the text is
tokenized once, cut into windows of `ctx` tokens (512 by default), and each
window is scored on its second half only, so every scored token has at least
ctx/2 tokens of context. The figures are therefore comparable with llama.cpp's.

Model, context and decoding come from the llama.cpp boundary, llmctl.runtime.llama."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from llmctl.errors import BadModelFile, LlmctlError, UsageError
from llmctl.runtime.llama import ContextConfig, LlamaContext, LlamaModel, capture_log
from llmctl.runtime.system import default_threads

DEFAULT_CTX = 512


@dataclass
class PerplexityResult:
    model: str
    perplexity: float
    stderr: float          # ± of the estimate, as llama.cpp prints it
    chunks: int
    ctx: int
    tokens_scored: int
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def _open(path: Path, ctx: int, threads: int) -> tuple[LlamaModel, LlamaContext]:
    """A model and a one-sequence context that decodes a window in one call.
    Raises BadModelFile when llama.cpp cannot load either."""
    with capture_log() as log:
        try:
            # -1 offloads every layer where a GPU is, as llama-perplexity does.
            model = LlamaModel(path, n_gpu_layers=-1)
        except BadModelFile:
            raise BadModelFile(f"{path}: llama.cpp cannot load it "
                               f"({log.last_error('unsupported or corrupt model')})") from None
    try:
        # One ubatch per window, as llama-perplexity runs it.
        context = LlamaContext(model, ContextConfig(n_ctx_seq=ctx, n_seq_max=1, n_batch=ctx,
                                                    n_threads=threads, n_ubatch=ctx))
    except LlmctlError as e:
        model.close()
        raise BadModelFile(f"{path}: cannot create a context of {ctx} tokens") from e
    return model, context


def _window_nll(context: LlamaContext, window: list[int], first: int) -> np.ndarray:
    """Negative log-likelihoods of window[first+1:], one decode call."""
    context.clear()
    logits = context.decode_rows(window, first)[:-1]
    targets = np.asarray(window[first + 1:])
    peak = logits.max(axis=1, keepdims=True)
    log_z = np.log(np.exp(logits - peak).sum(axis=1, dtype=np.float64)) + peak[:, 0]
    return log_z - logits[np.arange(len(targets)), targets]


def perplexity(model: str | Path, text: str, *, ctx: int = DEFAULT_CTX,
               threads: int | None = None, max_chunks: int | None = None,
               progress: Callable[[int, int], None] | None = None) -> PerplexityResult:
    """Perplexity of the GGUF file `model` on `text`. Raises UsageError for
    a bad `ctx` or a text shorter than two windows, BadModelFile when
    llama.cpp cannot load the model, DecodeError when a window fails."""
    if ctx < 16 or ctx % 2:
        raise UsageError("--ctx must be an even number of at least 16", param="ctx")
    path = Path(model)
    started = time.perf_counter()
    llm, context = _open(path, ctx, threads or default_threads())
    try:
        # add_special: the same BOS handling as llama-perplexity.
        tokens = llm.tokenize(text, add_special=True, parse_special=False)
        if len(tokens) < 2 * ctx:
            raise UsageError(f"the text has {len(tokens)} tokens; perplexity with a "
                             f"{ctx}-token window needs at least {2 * ctx}")
        n_chunks = len(tokens) // ctx
        if max_chunks:
            n_chunks = min(n_chunks, max_chunks)
        nll = []
        for i in range(n_chunks):
            window = tokens[i * ctx:(i + 1) * ctx]
            if llm.add_bos:
                window[0] = llm.bos
            nll.append(_window_nll(context, window, ctx // 2))
            if progress:
                progress(i + 1, n_chunks)
    finally:
        context.close()
        llm.close()
    values = np.concatenate(nll)
    mean = float(values.mean())
    ppl = math.exp(mean)
    var = float((values ** 2).mean()) - mean * mean
    stderr = math.sqrt(var / (len(values) - 1)) * ppl if var > 0 and len(values) > 1 else 0.0
    return PerplexityResult(model=str(path), perplexity=ppl, stderr=stderr, chunks=n_chunks,
                            ctx=ctx, tokens_scored=len(values),
                            seconds=time.perf_counter() - started)

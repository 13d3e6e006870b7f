"""One loaded model behind one small API that `chat`, `run` and `serve`
share: load by reference, turn messages into tokens, stream a completion."""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Callable, Iterator

from llmctl.errors import InvalidParams, UsageError
from llmctl.runtime import planner
from llmctl.runtime.backend import LlamaModel, supports_gpu_offload
from llmctl.runtime.engine import Engine, EngineConfig
from llmctl.runtime.events import ErrorEvent, FinishEvent, TokenEvent, Usage
from llmctl.runtime.prefix_cache import PrefixCache
from llmctl.runtime.sampling import SamplingParams
from llmctl.runtime.system import default_threads, list_gpus
from llmctl.runtime.template import ChatTemplate, normalize_messages
from llmctl.store.resolve import ResolvedModel, resolve_model

DEFAULT_CTX = 4096


@dataclass(frozen=True)
class LoadOptions:
    ctx_size: int | None = None          # tokens per sequence
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
            raise UsageError("max_num_batched_tokens must exceed max_num_seqs")
        try:
            planner.parse_gpu_layers(self.n_gpu_layers)
        except ValueError as e:
            raise UsageError(f"invalid n_gpu_layers {self.n_gpu_layers!r}: use auto or a number") from e


@dataclass
class Completion:
    text: str
    finish_reason: str
    usage: Usage
    ttft_s: float
    tokens_per_s: float
    duration_s: float


def _gpu_layers(resolved: ResolvedModel, opts: LoadOptions, n_ctx: int) -> int:
    fixed = planner.parse_gpu_layers(opts.n_gpu_layers)
    if fixed is not None:
        return fixed
    capable = supports_gpu_offload()
    gpus = list_gpus() if capable else []
    if not gpus:
        return 0
    from llmctl.store.gguf_info import read_gguf_info

    info = read_gguf_info(resolved.path)
    shape = planner.ModelShape(info.size, info.n_layers, info.n_embd, info.n_head,
                               info.n_head_kv or info.n_head, head_dim=info.head_dim)
    return planner.plan_gpu_layers(shape, [g.free_mib << 20 for g in gpus],
                                   n_ctx * opts.max_num_seqs, capable)


class LLM:
    def __init__(self, resolved: ResolvedModel, opts: LoadOptions):
        self.name = resolved.name
        self.resolved = resolved
        self.opts = opts
        n_ctx = opts.ctx_size or resolved.context or DEFAULT_CTX
        self.n_gpu_layers = _gpu_layers(resolved, opts, n_ctx)
        self.model = LlamaModel(resolved.path, n_gpu_layers=self.n_gpu_layers)
        if opts.ctx_size is None:
            n_ctx = min(n_ctx, self.model.n_ctx_train or n_ctx)
        self.template = ChatTemplate(
            resolved.template or self.model.chat_template(),
            bos_token=self.model.token_text(self.model.bos),
            eos_token=self.model.token_text(self.model.eos))
        self.prefix_cache = PrefixCache.for_model(self, n_ctx) if opts.prefix_cache else None
        self.engine = Engine(self.model, EngineConfig(
            n_ctx_seq=n_ctx, max_num_seqs=opts.max_num_seqs,
            max_num_batched_tokens=opts.max_num_batched_tokens, max_queue=opts.max_queue,
            n_threads=opts.threads or default_threads(), flash_attn=opts.flash_attn),
            prefix_cache=self.prefix_cache)

    @classmethod
    def load(cls, model: str | None, opts: LoadOptions | None = None) -> "LLM":
        return cls(resolve_model(model), opts or LoadOptions())

    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx_seq

    # ---- prompts ----------------------------------------------------------------

    def chat_tokens(self, messages: list[dict]) -> list[int]:
        text = self.template.render(normalize_messages(messages))
        return self.text_tokens(text)

    def text_tokens(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise InvalidParams("prompt must be a string", param="prompt")
        # Templates usually write the BOS text themselves; adding another
        # would give the model a doubled BOS it never saw in training.
        bos_text = self.template.bos_token
        add_bos = self.model.add_bos and not (bos_text and text.startswith(bos_text))
        tokens = self.model.tokenize(text, add_special=add_bos, parse_special=True)
        return tokens

    # ---- generation -------------------------------------------------------------

    def stream(self, tokens: list[int], params: SamplingParams) -> Iterator[TokenEvent | FinishEvent]:
        """Yield events until the finish; stopping early cancels the request."""
        events: queue.SimpleQueue = queue.SimpleQueue()
        seq = self.engine.submit(tokens, params, events.put)
        done = False
        try:
            while True:
                event = events.get()
                if isinstance(event, ErrorEvent):
                    done = True
                    raise event.error
                yield event
                if isinstance(event, FinishEvent):
                    done = True
                    return
        finally:
            if not done:
                self.engine.cancel(seq)

    def complete(self, tokens: list[int], params: SamplingParams,
                 on_text: Callable[[str], None] | None = None) -> Completion:
        """Generate to the end; `on_text` sees each piece as it streams."""
        parts: list[str] = []
        for event in self.stream(tokens, params):
            text = event.text if isinstance(event, TokenEvent) else event.tail
            if text:
                parts.append(text)
                if on_text:
                    on_text(text)
            if isinstance(event, FinishEvent):
                return Completion("".join(parts), event.reason, event.usage, event.ttft_s,
                                  event.tokens_per_s, event.duration_s)
        raise RuntimeError("engine stream ended without a finish event")

    def close(self) -> None:
        self.engine.close()
        self.model.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

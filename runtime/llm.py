"""One loaded model behind one small API that `chat`, `run` and `serve`
share: load by reference, turn messages into tokens, stream a completion."""

from __future__ import annotations

import asyncio
import queue
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from llmctl import settings
from llmctl.errors import ContextOverflow, InvalidParams, UsageError
from llmctl.runtime import planner
from llmctl.runtime.engine.bridge import EventBridge
from llmctl.runtime.engine.build import start_engine
from llmctl.runtime.engine.events import ErrorEvent, FinishEvent, TokenEvent, Usage
from llmctl.runtime.engine.logprobs import TokenLogprob
from llmctl.runtime.engine.loop import Engine
from llmctl.runtime.engine.sequence import Sequence, Status
from llmctl.runtime.engine.stats import Stats
from llmctl.runtime.formats.reasoning import opens_thought
from llmctl.runtime.formats.template import ChatTemplate, normalize_messages
from llmctl.runtime.formats.template_source import choose_template
from llmctl.runtime.formats.tool_calls import ToolFormat
from llmctl.runtime.llama import LlamaModel, render_builtin, supports_gpu_offload
from llmctl.runtime.load_options import EngineShape, LoadOptions
from llmctl.runtime.prefix_cache.cache import PrefixCache, Weights
from llmctl.runtime.sampling import SamplingParams
from llmctl.runtime.speculation.draft import check_compatible
from llmctl.runtime.system import default_threads, list_gpus
from llmctl.store.registry import load_registry
from llmctl.store.resolve import ResolvedModel, resolve_model

DEFAULT_CTX = 4096


# Longer texts cannot fit the context whatever the tokenizer does: no
# vocabulary has tokens this long on average. Checked before tokenizing, so
# a huge prompt is refused without allocating a token array for it.
MAX_CHARS_PER_TOKEN = 128

__all__ = ["LLM", "LoadOptions", "Completion", "EventFeed"]


@dataclass
class Completion:
    """A whole completion: its text, finish reason, usage, timings and (with
    params.logprobs) its tokens' log-probabilities."""

    text: str
    finish_reason: str
    usage: Usage
    ttft_s: float
    tokens_per_s: float
    duration_s: float
    logprobs: list[TokenLogprob] = field(default_factory=list)  # with params.logprobs


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
    shape = planner.ModelShape.from_info(info, opts.kv_type)
    return planner.plan_gpu_layers(shape, [g.free_mib << 20 for g in gpus],
                                   n_ctx * opts.max_num_seqs, capable)


def draft_for(resolved: ResolvedModel, opts: LoadOptions) -> ResolvedModel | None:
    """The draft model `opts` asks for: the one named, else the registry's
    default draft for `resolved`; None without `--spec draft`. Raises
    UsageError when there is none, and what resolving it raises."""
    if opts.spec_config.mode != "draft":
        return None
    entry = load_registry().get(resolved.name)
    ref = opts.draft or (entry.draft if entry else None)
    if not ref:
        raise UsageError(f"--spec draft: no draft model for {resolved.name!r}; name one with "
                         "--draft MODEL (or give it `draft` in models.toml)")
    return resolve_model(ref)


def check_draft(resolved: ResolvedModel, opts: LoadOptions) -> None:
    """Compare the vocabularies of `resolved` and its draft (loading only
    those), so a server refuses a bad pair before it listens. Raises what
    draft_for and check_compatible raise."""
    ref = draft_for(resolved, opts)
    if ref is None:
        return
    target = LlamaModel(resolved.path, vocab_only=True)
    draft = LlamaModel(ref.path, vocab_only=True)
    try:
        check_compatible(target, draft, (resolved.name, ref.name))
    finally:
        draft.close()
        target.close()


class LLM:
    """One loaded model with its chat template and engine, behind the API `chat`,
    `run` and `serve` share. Loading raises BadModelFile, TemplateError, UsageError (a
    bad draft or setting), OSError from the prefix cache and what making a context raises."""

    def __init__(self, resolved: ResolvedModel, opts: LoadOptions):
        self.name = resolved.name
        self.resolved = resolved
        self.opts = opts
        n_ctx = opts.ctx_size or resolved.context or DEFAULT_CTX
        self.n_gpu_layers = _gpu_layers(resolved, opts, n_ctx)
        self.model = LlamaModel(resolved.path, n_gpu_layers=self.n_gpu_layers,
                                repack=opts.repack)
        # The automatic options settle once it is known where the layers went.
        self.opts = opts = opts.on_device(self.offloaded)
        if opts.ctx_size is None:
            n_ctx = min(n_ctx, self.model.n_ctx_train or n_ctx)
        self.template_source = choose_template(
            override=resolved.template, gguf=self.model.chat_template(),
            architecture=self.model.meta("general.architecture") or "",
            has_token=self.model.has_token)
        self.template = self.template_source.build(
            self.name, render_builtin, bos_token=self.model.token_text(self.model.bos),
            eos_token=self.model.token_text(self.model.eos))
        self.draft_model = self._load_draft()
        entry = resolved.entry
        try:
            self.engine = start_engine(
                self.model, opts,
                EngineShape(n_ctx_seq=n_ctx, n_threads=opts.threads or default_threads()),
                weights=Weights(resolved.name, Path(resolved.path), entry.sha256 if entry else None),
                cache_root=settings.cache_dir() / "prefix", draft_model=self.draft_model)
        except BaseException:
            if self.draft_model is not None:
                self.draft_model.close()
            raise
        self.prefix_cache: PrefixCache | None = self.engine.prefix_cache
        self._bridges: dict[int, EventBridge] = {}
        self._templates: dict[str, ChatTemplate] = {}   # presets' templates by their text
        self._variables: dict[str, Any] = {}            # set_chat_format's

    def _load_draft(self) -> LlamaModel | None:
        """The draft model of `--spec draft`, loaded and checked. Raises
        what draft_for raises, and UsageError for another tokenizer."""
        ref = draft_for(self.resolved, self.opts)
        if ref is None:
            return None
        # On a GPU the small draft goes there whole: its per-token cost is
        # what speculation must keep below the target's.
        draft = LlamaModel(ref.path, n_gpu_layers=999 if self.n_gpu_layers else 0,
                           repack=self.opts.repack)
        try:
            check_compatible(self.model, draft, (self.name, ref.name))
        except BaseException:
            draft.close()
            raise
        return draft

    @classmethod
    def load(cls, model: str | None, opts: LoadOptions | None = None) -> "LLM":
        """Resolve `model` (None: the default) and load it with `opts`. Raises what
        resolve_model raises (ModelNotFound, BadModelFile, ...) and what loading raises."""
        return cls(resolve_model(model), opts or LoadOptions())

    @property
    def offloaded(self) -> bool:
        """Every layer, the output head too, is on a GPU."""
        n = self.n_gpu_layers
        return supports_gpu_offload() and (n < 0 or n > self.model.n_layer)

    @property
    def n_ctx(self) -> int:
        """Tokens each sequence's context holds."""
        return self.engine.n_ctx_seq

    # ---- what callers may ask of the model --------------------------------------

    @property
    def n_vocab(self) -> int:
        """Token ids run from 0 to n_vocab - 1."""
        return self.model.n_vocab

    @property
    def tool_format(self) -> ToolFormat:
        """The tool-call syntax the model's chat template writes."""
        return self.template.tool_format

    @property
    def thinks(self) -> bool:
        """Whether the chat template knows a <think> block."""
        return self.template.thinks

    def opens_thought(self, tokens: list[int]) -> bool:
        """Whether a prompt of `tokens` ends inside an open <think> block
        (the template opened it for the model)."""
        return opens_thought(self.model.detokenize(tokens[-8:]))

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """`text` in the model's vocabulary, with no length check (text_tokens
        has one); for an open LLM only. Raises nothing of its own."""
        return self.model.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: list[int]) -> str:
        """The text of `tokens` (ids below n_vocab)."""
        return self.model.detokenize(tokens)

    @property
    def alive(self) -> bool:
        """Whether the engine still runs: False once it failed or closed."""
        return self.engine.alive

    @property
    def failure(self) -> str | None:
        """Why the engine stopped, when it failed."""
        return self.engine.failure

    def stalled(self) -> str | None:
        """Why the engine counts as wedged (work and no step for too long);
        None when it is idle or moving."""
        return self.engine.stalled()

    # ---- prompts ----------------------------------------------------------------

    def chat_template(self, source: str | None = None) -> ChatTemplate:
        """The model's chat template, or for `source` (a preset's template
        text) that template with the model's BOS and EOS, compiled once per
        text. Raises TemplateError for text that is not valid Jinja."""
        if source is None:
            return self.template
        template = self._templates.get(source)
        if template is None:
            template = self._templates[source] = ChatTemplate(
                source, bos_token=self.template.bos_token, eos_token=self.template.eos_token)
        return template

    def set_chat_format(self, source: str | None, variables: Mapping[str, Any] | None) -> None:
        """Render every later chat with template text `source` (None: the
        model's) and template `variables`, for a caller that owns this LLM
        (`chat`, `run` with a preset); a shared one gets them per call of
        chat_tokens. Raises TemplateError for text that is not valid Jinja."""
        self.template = self.chat_template(source)
        self._variables = dict(variables or {})

    def chat_tokens(self, messages: list[dict], tools: list[dict] | None = None,
                    thinking: bool | None = None, *, template: str | None = None,
                    variables: Mapping[str, Any] | None = None) -> list[int]:
        """Tokens of a conversation rendered by the model's chat template
        (or the one `template` text makes, with template `variables`),
        with `tools` offered to it and its thought on or off (`thinking`;
        None: the template's default). Raises InvalidParams for malformed
        messages or tools, or tools the template can't render, and
        TemplateError for a template that fails."""
        chosen = self.chat_template(template)
        return self.text_tokens(chosen.render(normalize_messages(messages), tools,
                                              thinking=thinking,
                                              variables=self._variables if variables is None
                                              else variables))

    def text_tokens(self, text: str) -> list[int]:
        """Tokens of a prompt text. Raises InvalidParams for a non-string and
        ContextOverflow, before tokenizing, for a text far too long to fit."""
        if not isinstance(text, str):
            raise InvalidParams("prompt must be a string", param="prompt")
        if len(text) > self.n_ctx * MAX_CHARS_PER_TOKEN:
            raise ContextOverflow(f"the prompt ({len(text):,} characters) cannot fit the context "
                                  f"of {self.n_ctx} tokens", param="prompt")
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
        logprobs: list[TokenLogprob] = []
        for event in self.stream(tokens, params):
            text = event.text if isinstance(event, TokenEvent) else event.tail
            logprobs += event.logprobs
            if text:
                parts.append(text)
                if on_text:
                    on_text(text)
            if isinstance(event, FinishEvent):
                return Completion("".join(parts), event.reason, event.usage, event.ttft_s,
                                  event.tokens_per_s, event.duration_s, logprobs)
        raise RuntimeError("engine stream ended without a finish event")

    def open_feed(self, tokens: list[int], params: SamplingParams) -> "EventFeed":
        """Submit a request for an asyncio consumer (call it on the event
        loop). Raises what Engine.submit raises, before anything streams."""
        loop = asyncio.get_running_loop()
        bridge = self._bridges.get(id(loop))
        if bridge is None or bridge.loop is not loop:
            bridge = self._bridges[id(loop)] = EventBridge(loop)
        events: asyncio.Queue = asyncio.Queue()
        return EventFeed(self.engine, self.engine.submit(tokens, params, bridge.sink(events)),
                         events)

    def stats(self) -> Stats:
        """The engine's counters: the one source for every stats view."""
        return self.engine.stats()

    def close(self) -> None:
        """Stop the engine, then free the draft model and the model."""
        self.engine.close()
        if self.draft_model is not None:
            self.draft_model.close()
        self.model.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class EventFeed:
    """One submitted request's events, read on an event loop: batches of
    TokenEvents ending with one FinishEvent or ErrorEvent. Closing it before
    the end (or leaving its `async with`) cancels the request, which frees
    its slot at the engine's next step."""

    def __init__(self, engine: Engine, seq: Sequence, events: asyncio.Queue):
        self._engine = engine
        self.seq = seq
        self._events = events
        self.done = False

    @property
    def n_prompt(self) -> int:
        return len(self.seq.prompt)

    @property
    def waiting(self) -> bool:
        """Still in the engine's queue, with no slot yet."""
        return self.seq.status is Status.WAITING

    async def next_batch(self, timeout: float | None = None) -> list:
        """Every event that has arrived, waiting for at least one. Raises
        asyncio.TimeoutError when none comes within `timeout` seconds."""
        # asyncio.timeout adds no task per call, unlike wait_for: this runs per token batch.
        async with asyncio.timeout(timeout or None):
            first = await self._events.get()
        batch = [first]
        while not self._events.empty():
            batch.append(self._events.get_nowait())
        if any(isinstance(e, (FinishEvent, ErrorEvent)) for e in batch):
            self.done = True
        return batch

    def close(self) -> None:
        if not self.done:
            self.done = True
            self._engine.cancel(self.seq)

    async def __aenter__(self) -> "EventFeed":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

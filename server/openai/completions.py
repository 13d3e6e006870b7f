"""/v1/chat/completions and /v1/completions: an OpenAI request becomes one
GenerationRequest (server/generation.py runs it), and its events become
one JSON body or server-sent events, one ChoiceWriter per choice."""

from __future__ import annotations

import json
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llmctl.runtime.engine.events import ErrorEvent, FinishEvent, Usage
from llmctl.runtime.sampling import SamplingParams
from llmctl.server import errors
from llmctl.server.answer_reader import AnswerReader, ToolSetup
from llmctl.server.fields import name_ignored
from llmctl.server.generation import (
    Answer,
    ChatPrompt,
    Event,
    Generation,
    GenerationRequest,
    Prompt,
    PromptFacts,
    SseDialect,
    TextPrompt,
    TokenPrompt,
    parse_generation,
    respond,
)
from llmctl.server.openai.choices import ChoiceWriter
from llmctl.server.openai.request import ParsedRequest, parse_request

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat(request: Request):
    """Messages through the model's chat template, tools offered."""
    return await _generate(request, chat=True)


@router.post("/v1/completions")
async def completions(request: Request):
    """A prompt (text or token ids) continued as it is."""
    return await _generate(request, chat=False)


async def _generate(request: Request, chat: bool) -> Response:
    state, req = await parse_generation(request, ("response_format", "tools"), parse_request,
                                        chat)
    generation = GenerationRequest(req.model, req.keep_alive, _prompt(req), req.structured,
                                   req.n, req.stream)
    dialect = _Completions(req, chat, state.reasoning_format)
    response = await respond(request, generation, dialect)
    # reasoning_effort on a model whose template does not think
    return name_ignored(response, req.think.named(req.think.fields, dialect.thinks),
                        request.url.path)


def _prompt(req: ParsedRequest) -> Prompt:
    if req.messages is not None:
        return ChatPrompt(req.messages, req.structured.tools, req.think.on)
    if isinstance(req.prompt, list):
        return TokenPrompt(req.prompt)
    return TextPrompt(req.prompt or "")


class _Completions(SseDialect):
    """OpenAI's side of a completion: its parameters as parsed, chat
    answers read for tool calls and thoughts, and its frames."""

    def __init__(self, req: ParsedRequest, chat: bool, reasoning_format: str):
        self.req, self.chat, self.reasoning_format = req, chat, reasoning_format
        self.thinks = False             # whether the model's template thinks, once known

    def sampling(self, n_ctx: int) -> SamplingParams:
        return self.req.params

    def reading(self, prompt: PromptFacts) -> ToolSetup | None:
        self.thinks = prompt.thinks or prompt.started_in_thought
        return self.req.structured.setup(
            prompt.tool_format, self.reasoning_format, thinks=prompt.thinks,
            started_in_thought=self.chat and prompt.started_in_thought)

    def frames(self, generation: Generation) -> _Reply:
        writers = [ChoiceWriter(i, AnswerReader(generation.setup) if self.chat else None,
                                generation.params.logprobs is not None)
                   for i in range(generation.n)]
        return _Reply(ResponseIds(generation.model, self.chat), writers, self.req.include_usage)


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _total(usages: list[Usage]) -> Usage:
    """One response's usage: the prompt counts once (the choices share it and
    its cache use), the completions add up."""
    first = usages[0]
    return Usage(first.prompt_tokens, sum(u.completion_tokens for u in usages),
                 first.cached_tokens)


class _Reply:
    """One response's frames: OpenAI's chunks or whole body, one
    ChoiceWriter per choice."""

    def __init__(self, ids: ResponseIds, writers: list[ChoiceWriter], include_usage: bool):
        self.ids, self.writers, self.include_usage = ids, writers, include_usage
        self.usages: list[Usage | None] = [None] * len(writers)

    def opening(self) -> str:
        choices = [c for w in self.writers if (c := w.first()) is not None]
        return _sse(self.ids.chunk(choices)) if choices else ""

    def frames(self, batch: list[tuple[int, Event]]) -> tuple[str, bool]:
        """The SSE frames for a batch of events, and whether the stream ends."""
        frames = []
        for index, event in batch:
            if isinstance(event, ErrorEvent):
                e = event.error
                frames.append(_sse(errors.error_body(e.message, e.error_type, e.code)))
                return "".join(frames) + "data: [DONE]\n\n", True
            frames += [_sse(self.ids.chunk([c])) for c in self.writers[index].chunks(event)]
            if isinstance(event, FinishEvent):
                self.usages[index] = event.usage
        usages = [u for u in self.usages if u is not None]
        if len(usages) < len(self.usages):
            return "".join(frames), False
        if self.include_usage:
            frames.append(_sse(self.ids.usage_chunk(_total(usages))))
        frames.append("data: [DONE]\n\n")
        return "".join(frames), True

    def body(self, answers: list[Answer]) -> dict:
        choices = [w.whole(a) for w, a in zip(self.writers, answers, strict=True)]
        return self.ids.body(choices, _total([a.finish.usage for a in answers]))


def usage_dict(usage: Usage) -> dict:
    """`usage` in OpenAI's shape, the cached prompt tokens under
    prompt_tokens_details."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


class ResponseIds:
    """The fields every object of one response shares; the choices come
    from server.choices."""

    def __init__(self, model: str, chat: bool):
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = model
        self.chat = chat

    def _base(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": "llmctl"}

    def chunk(self, choices: list[dict]) -> dict:
        """A streamed chunk carrying `choices`."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._base(obj), "choices": choices}

    def usage_chunk(self, usage: Usage) -> dict:
        return {**self.chunk([]), "usage": usage_dict(usage)}

    def body(self, choices: list[dict], usage: Usage) -> dict:
        """A whole (non-streamed) response."""
        obj = "chat.completion" if self.chat else "text_completion"
        return {**self._base(obj), "choices": choices, "usage": usage_dict(usage)}

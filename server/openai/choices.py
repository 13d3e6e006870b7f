"""One choice of a completion response in OpenAI's shapes: the streamed
choice objects of its chunks, or the whole choice, with `logprobs` when the
request asked for them (chat: `{"content": [...]}`; completions: the legacy
`tokens`/`token_logprobs`/`top_logprobs`/`text_offset` lists)."""

from __future__ import annotations

from llmctl.runtime.engine.events import FinishEvent, TokenEvent
from llmctl.runtime.engine.logprobs import Alternative, TokenLogprob
from llmctl.server.answer_reader import (
    AnswerEvent,
    AnswerReader,
    Finish,
    Folded,
    TextDelta,
    ThinkingDelta,
    ToolArgumentsDelta,
    ToolCallStart,
    fold,
    stop_details,
)
from llmctl.server.generation import Answer


def finish_reason(reason: str) -> str:
    """OpenAI's finish_reason for an engine's or a chat answer's: "stop",
    "length" or "tool_calls" (anything else, the loop guard's "loop" too,
    is "stop": `stop_details` says why)."""
    # "cancelled" never reaches a connected client; map defensively anyway.
    return reason if reason in ("stop", "length", "tool_calls") else "stop"


def _alt(a: Alternative) -> dict:
    return {"token": a.text, "logprob": a.logprob, "bytes": list(a.bytes)}


def chat_logprobs(entries: list[TokenLogprob]) -> dict:
    """A chat choice's `logprobs` object for `entries`."""
    return {"content": [{**_alt(e.chosen), "top_logprobs": [_alt(a) for a in e.top]}
                        for e in entries],
            "refusal": None}


class LegacyLogprobs:
    """/v1/completions' `logprobs` lists. `text_offset` counts characters
    from the start of the generated text, across chunks. As OpenAI does, each
    `top_logprobs` map holds the sampled token too."""

    def __init__(self) -> None:
        self.offset = 0

    def shape(self, entries: list[TokenLogprob]) -> dict:
        out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in entries:
            out["tokens"].append(e.chosen.text)
            out["token_logprobs"].append(e.chosen.logprob)
            top = {a.text: a.logprob for a in e.top}
            top.setdefault(e.chosen.text, e.chosen.logprob)
            out["top_logprobs"].append(top)
            out["text_offset"].append(self.offset)
            self.offset += len(e.chosen.text)
        return out


def _tool_call_delta(e: AnswerEvent) -> dict | None:
    """The `delta.tool_calls` entry of a call's start or arguments."""
    if isinstance(e, ToolCallStart):
        return {"index": e.index, "id": e.id, "type": "function",
                "function": {"name": e.name, "arguments": ""}}
    if isinstance(e, ToolArgumentsDelta):
        return {"index": e.index, "function": {"arguments": e.text}}
    return None


def chat_delta(e: AnswerEvent) -> dict | None:
    """An answer event as a chat chunk's `delta` (None: it adds none)."""
    if isinstance(e, TextDelta):
        return {"content": e.text}
    if isinstance(e, ThinkingDelta):
        return {"reasoning_content": e.text}
    call = _tool_call_delta(e)
    return {"tool_calls": [call]} if call is not None else None


def chat_message(folded: Folded, plain: bool) -> dict:
    """The whole assistant message; a `plain` answer (no tools, no thought
    read) keeps its text as it is, an empty one included."""
    message: dict = {"role": "assistant",
                     "content": (folded.content or "") if plain else folded.content}
    if folded.thinking is not None:
        message["reasoning_content"] = folded.thinking
    if folded.calls:
        message["tool_calls"] = [c.to_openai() for c in folded.calls]
    return message


class ChoiceWriter:
    """The choice objects of answer number `index`. Chat text is read by an
    AnswerReader (tool calls, reasoning) and its events rendered as OpenAI's
    deltas. Log-probabilities ride on the first chunk that carries their
    text; text the reader still holds keeps them pending until it is
    released (or the answer ends)."""

    def __init__(self, index: int, reader: AnswerReader | None, logprobs: bool):
        self.index = index
        self.reader = reader            # None: /v1/completions
        self.logprobs = logprobs
        self._legacy = LegacyLogprobs()   # completions' offsets; chat has no use for it
        self._pending: list[TokenLogprob] = []

    def first(self) -> dict | None:
        """The opening chat chunk's choice (the role); None for completions."""
        if self.reader is None:
            return None
        return self._choice({"role": "assistant", "content": ""}, None, [])

    def chunks(self, event: TokenEvent | FinishEvent) -> list[dict]:
        """The choice objects one engine event adds to the stream."""
        self._pending += event.logprobs
        if self.reader is None:
            end = event.reason if isinstance(event, FinishEvent) else None
            text = event.tail if isinstance(event, FinishEvent) else event.text
            out = [self._text(text, None)] if text else []
            if end is not None:
                out.append(self._text("", finish_reason(end)) | stop_details(end))
            return out
        events = (self.reader.finish(event) if isinstance(event, FinishEvent)
                  else self.reader.feed(event.text))
        out = []
        for e in events:
            if isinstance(e, Finish):
                out.append(self._delta({}, finish_reason(e.reason)) | stop_details(e.reason))
            elif (delta := chat_delta(e)) is not None:
                out.append(self._delta(delta, None))
        return out

    def whole(self, answer: Answer) -> dict:
        """The whole choice of a complete answer."""
        if self.reader is None:
            lp = self._legacy.shape(answer.logprobs) if self.logprobs else None
            return {"index": self.index, "text": answer.text, "logprobs": lp,
                    "finish_reason": finish_reason(answer.finish.reason),
                    **stop_details(answer.finish.reason)}
        folded = fold(self.reader.whole(answer.pieces or (answer.text,), answer.finish))
        assert folded.finish is not None
        return {"index": self.index,
                "message": chat_message(folded, plain=self.reader.setup is None),
                "logprobs": chat_logprobs(answer.logprobs) if self.logprobs else None,
                "finish_reason": finish_reason(folded.finish.reason),
                **stop_details(folded.finish.reason)}

    def _take(self) -> list[TokenLogprob]:
        taken, self._pending = self._pending, []
        return taken

    def _text(self, text: str, finish: str | None) -> dict:
        lp = self._legacy.shape(self._take()) if self.logprobs else None
        return {"index": self.index, "text": text, "logprobs": lp, "finish_reason": finish}

    def _delta(self, delta: dict, finish: str | None) -> dict:
        return self._choice(delta, finish, self._take())

    def _choice(self, delta: dict, finish: str | None, entries: list[TokenLogprob]) -> dict:
        lp = chat_logprobs(entries) if self.logprobs and entries else None
        return {"index": self.index, "delta": delta, "logprobs": lp, "finish_reason": finish}

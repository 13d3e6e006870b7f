"""One choice of a completion response in OpenAI's shapes: the streamed
choice objects of its chunks, or the whole choice, with `logprobs` when the
request asked for them (chat: `{"content": [...]}`; completions: the legacy
`tokens`/`token_logprobs`/`top_logprobs`/`text_offset` lists)."""

from __future__ import annotations

from llmctl.runtime.engine.events import FinishEvent, TokenEvent
from llmctl.runtime.engine.logprobs import Alternative, TokenLogprob
from llmctl.server.chat_output import ChatShaper


def finish_reason(reason: str) -> str:
    """OpenAI's finish_reason for an engine's: "stop" or "length" (anything else
    is "stop")."""
    # "cancelled" never reaches a connected client; map defensively anyway.
    return reason if reason in ("stop", "length") else "stop"


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


class ChoiceWriter:
    """The choice objects of answer number `index`. Chat text goes through a
    ChatShaper (tool calls, reasoning). Log-probabilities ride on the first
    chunk that carries their text; text a shaper still holds keeps them
    pending until it is released (or the answer ends)."""

    def __init__(self, index: int, shaper: ChatShaper | None, logprobs: bool):
        self.index = index
        self.shaper = shaper            # None: /v1/completions
        self.logprobs = logprobs
        self._legacy = LegacyLogprobs()   # completions' offsets; chat has no use for it
        self._pending: list[TokenLogprob] = []

    def first(self) -> dict | None:
        """The opening chat chunk's choice (the role); None for completions."""
        if self.shaper is None:
            return None
        return self._choice({"role": "assistant", "content": ""}, None, [])

    def chunks(self, event: TokenEvent | FinishEvent) -> list[dict]:
        """The choice objects one engine event adds to the stream."""
        self._pending += event.logprobs
        end = event.reason if isinstance(event, FinishEvent) else None
        text = event.tail if isinstance(event, FinishEvent) else event.text
        if self.shaper is None:
            out = [self._text(text, None)] if text else []
            if end is not None:
                out.append(self._text("", finish_reason(end)))
            return out
        deltas = self.shaper.feed(text) if end is None else self.shaper.finish(text)
        out = [self._delta(d, None) for d in deltas]
        if end is not None:
            out.append(self._delta({}, self.shaper.finish_reason(end)))
        return out

    def whole(self, text: str, event: FinishEvent, logprobs: list[TokenLogprob]) -> dict:
        """The whole choice for the complete generated `text`."""
        if self.shaper is None:
            lp = self._legacy.shape(logprobs) if self.logprobs else None
            return {"index": self.index, "text": text, "logprobs": lp,
                    "finish_reason": finish_reason(event.reason)}
        return {"index": self.index, "message": self.shaper.message(text),
                "logprobs": chat_logprobs(logprobs) if self.logprobs else None,
                "finish_reason": self.shaper.finish_reason(event.reason)}

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

"""The assistant message of a chat answer in OpenAI's shapes: plain content,
or content plus `tool_calls` (and `reasoning_content`) parsed from the
model's own tool-call syntax, whole or as streamed deltas. Both paths run
the same parser, so a streamed answer adds up to the non-streamed one."""

from __future__ import annotations

from dataclasses import dataclass

from llmctl.runtime.formats.tool_calls import (
    ContentDelta,
    ReasoningDelta,
    ToolCallDelta,
    ToolCallStream,
    ToolFormat,
    collect,
)


@dataclass(frozen=True)
class ToolSetup:
    """How to read one answer: the model's tool-call format, the names it may
    call (an empty set: none), whether several calls are allowed, whether a
    leading <think> block is split off as reasoning, and whether the
    tool-call grammar writes the calls (`constrained`: then a call's
    arguments stream as they are written, see ToolCallStream; a protocol
    whose calls travel whole, as Ollama's, leaves it False)."""

    fmt: ToolFormat
    names: frozenset[str]
    parallel: bool = True
    reasoning: bool = True
    started_in_thought: bool = False
    constrained: bool = False


class ChatShaper:
    """Turns the engine's text pieces into chat deltas (streaming) or one
    message (whole). Without a ToolSetup text passes through untouched."""

    def __init__(self, setup: ToolSetup | None):
        self.setup = setup
        # parallel_tool_calls=false: the first call only
        self.parallel = setup is None or setup.parallel
        self._parser = None if setup is None else ToolCallStream(
            setup.fmt, set(setup.names), setup.reasoning,
            started_in_thought=setup.started_in_thought, constrained=setup.constrained)
        self._deltas: list = []
        self.n_calls = 0
        # Pieces fed (the engine's tokens, as it releases them) before the
        # first content or call, and whether a thought was among them.
        self._before_answer, self._thought_seen, self._answering = 0, False, False

    @property
    def reasoning_tokens(self) -> int:
        """The tokens fed so far that went to the answer's leading thought."""
        return self._before_answer if self._thought_seen else 0

    def feed(self, text: str) -> list[dict]:
        """OpenAI `delta` objects for a piece of generated text."""
        if self._parser is None:
            return [{"content": text}] if text else []
        out = self._shape(self._parser.feed(text))
        if not self._answering:
            self._thought_seen |= any("reasoning_content" in d for d in out)
            self._answering = any("content" in d or "tool_calls" in d for d in out)
            self._before_answer += not self._answering
        return out

    def finish(self, tail: str = "") -> list[dict]:
        """The deltas still held back at the end of the answer."""
        out = self.feed(tail) if tail else []
        if self._parser is not None:
            out += self._shape(self._parser.finish())
        return out

    def _shape(self, deltas: list) -> list[dict]:
        out: list[dict] = []
        for d in deltas:
            if isinstance(d, ToolCallDelta):
                if d.index > 0 and not self.parallel:
                    continue
                self.n_calls = max(self.n_calls, d.index + 1)
                out.append({"tool_calls": [d.to_openai()]})
            elif isinstance(d, ReasoningDelta):
                out.append({"reasoning_content": d.text})
            elif isinstance(d, ContentDelta) and d.text:
                out.append({"content": d.text})
            self._deltas.append(d)
        return out

    def message(self, text: str) -> dict:
        """The whole assistant message for `text`, the full generated text."""
        if self._parser is None:
            return {"role": "assistant", "content": text}
        self._shape(self._parser.feed(text) + self._parser.finish())
        parsed = collect([d for d in self._deltas
                          if not (isinstance(d, ToolCallDelta) and d.index > 0
                                  and not self.parallel)])
        msg: dict = {"role": "assistant", "content": parsed.content}
        if parsed.reasoning is not None:
            msg["reasoning_content"] = parsed.reasoning
        if parsed.tool_calls:
            msg["tool_calls"] = [c.to_openai() for c in parsed.tool_calls]
        return msg

    @property
    def cut(self) -> bool:
        """Whether the output stopped inside a streamed call (max_tokens or a
        stop string): the call stands with the arguments written so far."""
        return self._parser is not None and self._parser.cut

    def finish_reason(self, engine_reason: str) -> str:
        """OpenAI's finish_reason: tool_calls when the answer called one,
        unless the output stopped inside the call ("length", as OpenAI's)."""
        if self.n_calls and not self.cut:
            return "tool_calls"
        return engine_reason if engine_reason in ("stop", "length") else "stop"

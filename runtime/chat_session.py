"""A multi-turn conversation: history, the system prompt and per-turn token
accounting. Kept apart from the terminal (the REPL and its slash commands
are in llmctl.cli.chat) so it is testable without one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

from llmctl.runtime.engine.events import FinishEvent, TokenEvent

if TYPE_CHECKING:
    from llmctl.runtime.llm import LLM
    from llmctl.runtime.sampling import SamplingParams


@dataclass
class TurnStats:
    """One turn's figures, as the engine reported them at its finish."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    ttft_s: float
    tokens_per_s: float

    @classmethod
    def from_finish(cls, event: FinishEvent) -> TurnStats:
        """The one place a turn's figures are read from the engine."""
        return cls(event.usage.prompt_tokens, event.usage.completion_tokens,
                   event.usage.cached_tokens, event.ttft_s, event.tokens_per_s)


@dataclass
class ChatSession:
    """A conversation with one LLM: the system prompt and history its turns
    send, and the figures of the last turn (`last`)."""

    llm: LLM
    params: SamplingParams
    system: str | None = None
    history: list[dict] = field(default_factory=list)
    last: TurnStats | None = None

    def messages(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.history

    def clear(self) -> None:
        """Forget the conversation; the system prompt stays."""
        self.history.clear()

    def set_system(self, text: str | None) -> None:
        """Replace the system prompt (None removes it) and start over."""
        self.system = text
        self.history.clear()

    def ask(self, text: str) -> Iterator[str]:
        """Stream the answer to one user turn. If the consumer stops early
        (Ctrl-C), the partial answer is kept so the conversation stays
        coherent, and the request is cancelled in the engine. Raises the
        engine's LlmctlError (e.g. ContextOverflow) when a turn fails."""
        self.history.append({"role": "user", "content": text})
        tokens = self.llm.chat_tokens(self.messages())
        parts: list[str] = []
        try:
            for event in self.llm.stream(tokens, self.params):
                chunk = event.text if isinstance(event, TokenEvent) else event.tail
                if chunk:
                    parts.append(chunk)
                    yield chunk
                if isinstance(event, FinishEvent):
                    self.last = TurnStats.from_finish(event)
        finally:
            self.history.append({"role": "assistant", "content": "".join(parts)})

    def answer(self, text: str, on_text: Callable[[str], None] | None = None) -> str:
        """The whole answer to one user turn, streamed to `on_text`; raises as ask()."""
        parts = []
        for chunk in self.ask(text):
            parts.append(chunk)
            if on_text:
                on_text(chunk)
        return "".join(parts)

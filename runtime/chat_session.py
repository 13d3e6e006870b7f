"""A multi-turn conversation: history, slash commands and per-turn stats.
Kept apart from the terminal so it is testable without one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

from llmctl.runtime.events import FinishEvent, TokenEvent
from llmctl.runtime.llm import LLM
from llmctl.runtime.sampling import SamplingParams

HELP = """Commands:
  /help          show this help
  /clear         forget the conversation (keeps the system prompt)
  /system TEXT   set the system prompt and start over
  /stats         speed of the last answer
  /bye           leave (Ctrl-D works too; Ctrl-C stops an answer)"""


@dataclass
class TurnStats:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float = 0.0
    tokens_per_s: float = 0.0

    def describe(self) -> str:
        return (f"prompt {self.prompt_tokens} tok ({self.cached_tokens} cached), generated "
                f"{self.completion_tokens} tok, TTFT {self.ttft_s:.3f}s, "
                f"{self.tokens_per_s:.1f} tok/s")


@dataclass
class ChatSession:
    llm: LLM
    params: SamplingParams
    system: str | None = None
    history: list[dict] = field(default_factory=list)
    last: TurnStats | None = None

    def messages(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.history

    def command(self, line: str) -> tuple[str, bool]:
        """Handle a slash command: (text to show, whether to leave)."""
        name, _, arg = line.strip().partition(" ")
        if name in ("/bye", "/exit", "/quit"):
            return "", True
        if name == "/help":
            return HELP, False
        if name == "/clear":
            self.history.clear()
            return "Conversation cleared.", False
        if name == "/system":
            self.system = arg.strip() or None
            self.history.clear()
            return ("System prompt set." if self.system else "System prompt removed."), False
        if name == "/stats":
            return (self.last.describe() if self.last else "No answer yet."), False
        return f"Unknown command {name}; try /help.", False

    def ask(self, text: str) -> Iterator[str]:
        """Stream the answer to one user turn. If the consumer stops early
        (Ctrl-C), the partial answer is kept so the conversation stays
        coherent, and the request is cancelled in the engine."""
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
                    self.last = TurnStats(event.usage.prompt_tokens, event.usage.completion_tokens,
                                          event.usage.cached_tokens, event.ttft_s,
                                          event.tokens_per_s)
        finally:
            self.history.append({"role": "assistant", "content": "".join(parts)})

    def answer(self, text: str, on_text: Callable[[str], None] | None = None) -> str:
        parts = []
        for chunk in self.ask(text):
            parts.append(chunk)
            if on_text:
                on_text(chunk)
        return "".join(parts)

"""An answer that only repeats the tool calls whose results end the
conversation is asked again, once, with a line asking for the answer.

Small models do this: Qwen2.5-Coder-1.5B, handed its call's result under
the upstream Qwen2.5 template, writes the same call again, turn after turn,
and an agent loops until its max_turns (docs/tools.md). A call identical
to one just answered (same name, same arguments) is almost never what the
client wants, and its result is already in the conversation.

Applies to one chat answer with tools under tool_choice "auto" whose
conversation ends with the results of the last assistant turn's calls.
While such an answer opens with calls, its events are held (a client acts
on a call only once it ends anyway); at its end, calls that all repeat
are dropped and the model asked again with the line below added (the
prompt before it is in the prefix cache), and that answer goes to the
client. Anything else (text, another call) releases what was held at once."""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

from llmctl.runtime.engine.events import ErrorEvent, FinishEvent, TokenEvent
from llmctl.runtime.formats.tool_calls import TextDelta
from llmctl.server.answer_reader import AnswerReader, ToolCallEnd, ToolSetup
from llmctl.server.tool_protocol import Structured
from llmctl.tools.agent import call_key

log = logging.getLogger("llmctl.server")
ANSWER_NOW = "The tool results above answer those calls. Answer the question now, from them."


def answered_calls(messages: list[dict]) -> set[tuple[str, str]]:
    """The (name, arguments) of the last assistant turn's calls when the
    conversation ends with their results; empty otherwise."""
    end = len(messages)
    while end and messages[end - 1].get("role") == "tool":
        end -= 1
    if end == len(messages) or not end or messages[end - 1].get("role") != "assistant":
        return set()
    calls = messages[end - 1].get("tool_calls") or []
    answered = {m.get("tool_call_id") for m in messages[end:]}
    if not calls or any(c.get("id") not in answered for c in calls if isinstance(c, dict)):
        return set()
    return {call_key(c["function"].get("name", ""), c["function"].get("arguments"))
            for c in calls if isinstance(c, dict) and isinstance(c.get("function"), dict)}


def guarded(merged, messages: list[dict], structured: Structured, setup: ToolSetup,
            reopen: Callable[[list[dict]], Awaitable[object]]):
    """`merged`, or a RepeatGuard over it where the rule applies (one
    answer with tools under "auto", the conversation ending in results);
    `reopen(messages)` opens the answer to the conversation given."""
    answered = answered_calls(messages) if structured.tools and \
        structured.choice.mode == "auto" else set()
    if not answered:
        return merged
    again = [*messages, {"role": "user", "content": ANSWER_NOW}]
    return RepeatGuard(merged, setup, answered, lambda: reopen(again))


class RepeatGuard:
    """Merged's events (generation.py), with an answer that only repeats
    `answered` replaced by `again()`'s, once."""

    def __init__(self, merged, setup: ToolSetup, answered: set[tuple[str, str]],
                 again: Callable[[], Awaitable[object]]):
        self._merged, self._probe = merged, AnswerReader(setup)
        self._answered, self._again = answered, again
        self._held: list = []
        self._passing = False

    @property
    def feeds(self):
        return self._merged.feeds

    def close(self) -> None:
        self._merged.close()

    async def next_batch(self, timeout: float | None = None) -> list:
        if self._passing:
            return await self._merged.next_batch(timeout)
        while True:
            batch = await self._merged.next_batch(timeout)
            for pair in batch:
                self._held.append(pair)
                if self._judge(pair[1]):
                    self._merged.close()
                    log.info("answer repeated the calls just answered: asked again")
                    self._merged = await self._again()
                    self._held, self._passing = [], True
                    return await self._merged.next_batch(timeout)
            if self._passing:
                held, self._held = self._held, []
                return held

    def _judge(self, event: object) -> bool:
        """Whether the held answer only repeated answered calls (ask
        again); sets _passing once it is anything else."""
        if isinstance(event, ErrorEvent) or (isinstance(event, FinishEvent)
                                             and event.reason == "cancelled"):
            self._passing = True
            return False
        if isinstance(event, TokenEvent):
            events = self._probe.feed(event.text)
        elif isinstance(event, FinishEvent):
            events = self._probe.finish(event)
        else:
            return False
        for e in events:
            if isinstance(e, TextDelta) and e.text.strip():
                self._passing = True
            elif isinstance(e, ToolCallEnd):
                if call_key(e.call.name, e.call.arguments) not in self._answered:
                    self._passing = True
        if isinstance(event, FinishEvent) and not self._passing:
            if self._probe.n_calls:
                return True
            self._passing = True
        return False

"""Tool calls in model output: a parser that turns the model's text into
OpenAI-shaped content, reasoning and tool calls, streamed or whole. The
formats and shapes it deals in are in tool_shapes.py (re-exported here).

The parser never raises on model output. A call marker followed by anything
that is not a well-formed call (malformed JSON, arguments that are not an
object, a name outside the request's tools) stays in the content verbatim:
the client sees what the model wrote, and an agent is never handed a call it
cannot execute. Content is stripped of surrounding whitespace and is None
when nothing but whitespace is left, as OpenAI sends null content beside
tool calls.

Hermes models (Qwen2.5 among them) also write calls as a Markdown code
block that opens the answer, as llama.cpp's Hermes parser accepts: ```json
(or ```, ```xml, ```tool_call) around a call object, an array of them, or
<tool_call> blocks. A fence anywhere else is the answer's own code. Small
ones write a bare call object as their whole answer, too, and that is the
only place it is a call: an answer that opens with `{"name":` is held until
it ends; with nothing but whitespace after the object it is a call, and
when any other text follows (a small model echoing its last call after a
tool's result, then answering) the whole answer is content byte for byte.
JSON whose first key is another stays content.

Validation of the request's `tools`/`tool_choice` is in tool_schema.py."""

from __future__ import annotations

import re
from typing import Callable

from llmctl.runtime.formats import call_syntax as syn
from llmctl.runtime.formats.call_stream import GrammarSections, whole_calls
from llmctl.runtime.formats.reasoning import ThinkSplitter, partial_marker_len
from llmctl.runtime.formats.stream_scan import Brackets, Trimmed
from llmctl.runtime.formats.tool_shapes import (
    Delta,
    ParsedMessage,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallDone,
    ToolFormat,
    call_id_factory,
    collect,
    detect_format,
)

__all__ = ["TextDelta", "Delta", "ParsedMessage", "ThinkingDelta", "ToolCall",
           "ToolCallDelta", "ToolCallDone", "ToolCallParser", "ToolFormat", "call_id_factory", "collect",
           "detect_format", "parse_tool_calls"]


def parse_tool_calls(text: str, fmt: ToolFormat, tool_names: set[str] | None = None, *,
                     reasoning: bool = True, started_in_thought: bool = False,
                     new_id: Callable[[], str] | None = None,
                     constrained: bool = False) -> ParsedMessage:
    """Content, tool calls and reasoning in a whole model output; see
    ToolCallParser for the arguments. Malformed calls and calls to names not
    in `tool_names` stay in the content. Raises nothing."""
    stream = ToolCallParser(fmt, tool_names, reasoning,
                            started_in_thought=started_in_thought, new_id=new_id,
                            constrained=constrained)
    return collect(stream.feed(text) + stream.finish())


class ToolCallParser(GrammarSections):
    """Parses model output as it streams. `feed(delta)` and `finish()` return
    the deltas decided so far; text that may begin a marker is held back until
    the next chunk decides it, and a call is emitted once its JSON is
    complete: one delta with index, id and name, one with its arguments
    (re-serialized compactly). Folding all deltas (collect()) gives exactly
    parse_tool_calls() of the whole text, however it was chunked.

    `constrained`: the tool-call grammar writes the calls; those it is sure
    to have written stream their arguments as the model writes them, and
    `cut` says the output stopped inside one (see call_stream.GrammarSections).

    `tool_names`: names a call may use; None accepts any, an empty set none.
    `doubled`: the template teaches calls as `{{"name": ...}}`, and a bare
    call in doubled braces is read as the call inside them.
    `reasoning`: a leading <think>…</think> goes to ThinkingDeltas; when
    False it stays in the content verbatim. Either way it is never parsed
    for tool calls. `started_in_thought`: the prompt already opened the
    thought (see reasoning.opens_thought). `new_id`: the id source, by
    default call_id_factory(). Raises ValueError for an unknown `fmt`, and
    nothing on any model output."""

    def __init__(self, fmt: ToolFormat, tool_names: set[str] | None = None,
                 reasoning: bool = True, *, started_in_thought: bool = False,
                 new_id: Callable[[], str] | None = None, constrained: bool = False,
                 doubled: bool = False) -> None:
        self._fmt = ToolFormat(fmt)
        self._doubled = doubled     # a bare call may come in doubled braces
        self._init_grammar(constrained and self._fmt is ToolFormat.HERMES, started_in_thought)
        self._names = tool_names
        self._reasoning = reasoning
        self._new_id = new_id or call_id_factory()
        self._think = ThinkSplitter(started_in_thought)
        self._content, self._thought = Trimmed(), Trimmed()
        self._out: list[Delta] = []
        self._buf = ""
        self._mode = "start"
        self._raw = ""  # the marker that opened the current section
        self._scan: Brackets | None = None
        self._head: str | None = None  # the name in Mistral's name[ARGS]{…} form
        self._fenced = False  # the current <tool_call> block is inside a code fence
        self._held: tuple[str, list[tuple[str, str]]] | None = None  # a tagless call: its text, its calls
        self._index = 0

    def feed(self, text: str) -> list[Delta]:
        return self._run(text, final=False)

    def finish(self) -> list[Delta]:
        """Decides all text held back; call once, after the last feed."""
        return self._run("", final=True)

    def _run(self, text: str, final: bool) -> list[Delta]:
        self._watch_opening(text)
        for kind, part in self._think.feed(text, final):
            self._at_start = self._at_start and kind == "body"
            if kind == "body":
                self._buf += part
                while getattr(self, "_in_" + self._mode)(final):
                    pass
            elif self._reasoning:
                if kind == "thought":
                    self._emit(ThinkingDelta, self._thought.push(part))
            else:
                self._emit(TextDelta, self._content.push(part))
        if final:
            while getattr(self, "_in_" + self._mode)(final):
                pass
        out, self._out = self._out, []
        return out

    def _emit(self, kind: type, text: str) -> None:
        if not text:
            return
        last = self._out[-1] if self._out else None
        if isinstance(last, (TextDelta, ThinkingDelta)) and type(last) is kind:
            self._out.pop()
            text = last.text + text
        self._out.append(kind(text))

    def _say(self, text: str) -> None:
        self._emit(TextDelta, self._content.push(text))

    def _open_section(self, mode: str, raw: str, fenced: bool = False) -> bool:
        self._mode, self._raw, self._scan, self._head = mode, raw, None, None
        self._fenced = fenced
        return True

    def _fail(self) -> bool:
        """Not a call after all: the marker becomes content and the text after
        it is read again as content."""
        self._say(self._raw)
        return self._open_section("content", "")

    def _in_start(self, final: bool) -> bool:
        if self._fmt is ToolFormat.HERMES and self._names != set():
            return self._open_section("fence", "")
        head = self._buf.lstrip()
        opener = syn.OPENERS.get(self._fmt)
        if not head and not final:
            return False
        if opener is not None and opener.match(head):
            section = "array" if self._fmt is ToolFormat.MISTRAL else "json_seq"
            return self._open_section(section, "")
        if opener is not None and not final and re.fullmatch(r"\[\s*", head):
            return False
        return self._open_section("content", "")

    def _in_content(self, final: bool) -> bool:
        marker = syn.MARKERS.get(self._fmt)
        at = self._buf.find(marker) if marker else -1
        if marker and at >= 0:
            self._say(self._buf[:at])
            self._buf = self._buf[at + len(marker):]
            # Llama's <|python_tag|> is a control token clients never see.
            raw = "" if self._fmt is ToolFormat.LLAMA3 else marker
            section = {ToolFormat.HERMES: "hermes", ToolFormat.LLAMA3: "json_seq"}
            return self._open_section(section.get(self._fmt, "mistral"), raw)
        keep = 0 if final or not marker else partial_marker_len(self._buf, (marker,))
        self._say(self._buf[:len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep:]
        return False

    def _json_at(self, final: bool, start: int = 0) -> tuple[int, int | None, bool]:
        """(where the JSON value begins, its end, whether to keep waiting):
        the value under scan, or else the one at `start`."""
        if self._scan is None:
            self._scan = Brackets(start)
        end = self._scan.end(self._buf)
        return self._scan.start, end, end is None and not final

    def _in_hermes(self, final: bool) -> bool:
        if self._constrained and not self._grammar_opened():
            return self._stream(0, "</tool_call>", "free_hermes",
                                "fence_close" if self._fenced else "content")
        return self._in_free_hermes(final)

    def _in_free_hermes(self, final: bool) -> bool:
        head = self._buf.lstrip()
        if not head:
            return self._fail() if final else False
        if head[0] != "{":
            return self._fail()
        start, end, wait = self._json_at(final, len(self._buf) - len(head))
        if wait:
            return False
        if end is None:
            return self._fail()
        close = syn.HERMES_CLOSE.match(self._buf, end)
        rest = self._buf[end:].lstrip()
        if close is None and not final and "</tool_call>".startswith(rest):
            return False
        if close is None and rest:
            return self._fail()
        return self._accept(start, end, close.end() if close else len(self._buf),
                            "fence_close" if self._fenced else "content")

    def _in_fence(self, final: bool) -> bool:
        """At the start of the answer, or right after a fenced call: a code
        fence opening a call, or content. Until the fence line and the first
        character of its body decide, the text is held back."""
        head = self._buf.lstrip()
        if head.startswith("{") and self._index == 0:  # only a whole answer can be bare
            return self._bare_opening(head, final)
        m = syn.FENCE_OPEN.match(head)
        if m is None:
            if not final and syn.FENCE_OPEN_SO_FAR.fullmatch(head):
                return False
            return self._open_section("content", "")
        body = head[m.end():].lstrip()
        at = len(self._buf) - len(body)
        if body.startswith("<tool_call>"):
            at += len("<tool_call>")
            raw, self._buf = self._buf[:at], self._buf[at:]
            return self._open_section("hermes", raw, fenced=True)
        if body[:1] in ("{", "["):
            self._open_section("fenced_json", "")
            self._scan = Brackets(at)
            if self._constrained and self._index == 0 and self._at_start:
                return self._stream(at, syn.FENCE, "fenced_json", "fence", self._grammar_opened)
            return True
        if not final and "<tool_call>".startswith(body):
            return False
        return self._open_section("content", "")

    def _bare_opening(self, head: str, final: bool) -> bool:
        """A call object without tag or fence, or (another first key) content."""
        if syn.BARE_CALL.match(head) or (self._doubled and syn.DOUBLED_CALL.match(head)):
            self._open_section("bare", "")
            self._scan = Brackets(len(self._buf) - len(head))
            return True
        so_far = syn.DOUBLED_CALL_SO_FAR if self._doubled else syn.BARE_CALL_SO_FAR
        if not final and so_far.fullmatch(head):
            return False
        return self._open_section("content", "")

    def _in_bare(self, final: bool) -> bool:
        # Not a call after all (no arguments, a name outside the tools,
        # malformed): the text is read again as content, unchanged.
        start, end, wait = self._json_at(final)
        if wait:
            return False
        if end is None:
            return self._fail()
        return self._hold(start, end, end)

    def _in_fenced_json(self, final: bool) -> bool:
        # Nothing but whitespace may sit between the JSON and the closing
        # fence, as between a <tool_call>'s JSON and its </tool_call>; what
        # follows the fence is content (llama.cpp reads it so too).
        start, end, wait = self._json_at(final)
        if wait:
            return False
        if end is None:
            return self._fail()
        rest = self._buf[end:].lstrip()
        if rest.startswith(syn.FENCE):
            stop = len(self._buf) - len(rest) + len(syn.FENCE)
        elif not final and syn.FENCE.startswith(rest):
            return False
        elif rest:
            return self._fail()
        else:  # the output ended inside the fence: the call stands, as an unclosed <tool_call>
            stop = len(self._buf)
        return self._accept(start, end, stop, "fence")

    def _hold(self, start: int, end: int, stop: int) -> bool:
        """A tagless call in buf[start:end], ending at buf[:stop]: held until
        what follows decides it, or content when it is not a call."""
        body = self._buf[start:end]
        if self._doubled and body.startswith("{{") and body.endswith("}}"):
            body = body[1:-1]       # the call inside the doubled braces
        calls = whole_calls(body, self._names, self._head)
        if calls is None:
            return self._fail()
        self._held = (self._buf[:stop], calls)
        self._buf = self._buf[stop:]
        return self._open_section("held", "")

    def _in_held(self, final: bool) -> bool:
        """After a tagless call: only whitespace to the end makes it a call;
        any other text makes the call's text content, and the rest is read
        as content as any answer's is."""
        assert self._held is not None
        text, calls = self._held
        if self._buf.strip():
            self._held = None
            self._say(text)
            return self._open_section("content", "")
        if not final:
            return False
        self._held, self._buf = None, ""
        self._emit_calls(calls)
        return self._open_section("content", "")

    def _in_fence_close(self, final: bool) -> bool:
        """After a <tool_call> block inside a fence: another block, the
        closing fence, or (anything else) content."""
        head = self._buf.lstrip()
        if head.startswith(syn.FENCE):
            self._buf = head[len(syn.FENCE):]
            return self._open_section("fence", "")
        if head.startswith("<tool_call>"):
            at = len(self._buf) - len(head) + len("<tool_call>")
            raw, self._buf = self._buf[:at], self._buf[at:]
            return self._open_section("hermes", raw, fenced=True)
        if not final and (syn.FENCE.startswith(head) or "<tool_call>".startswith(head)):
            return False
        return self._open_section("content", "")

    def _in_json_seq(self, final: bool) -> bool:
        # Separators between Llama 3's calls (";", newlines) are dropped.
        if self._scan is None:
            self._buf = self._buf.lstrip(syn.SEPARATORS)
            if not self._buf or self._buf[0] != "{":
                return self._open_section("content", "") if self._buf else False
        _, end, wait = self._json_at(final, 0)
        if wait:
            return False
        if end is None:
            return self._fail()
        return self._accept(0, end, end, "json_seq")

    def _in_array(self, final: bool) -> bool:
        head = self._buf.lstrip()
        if not head:
            return self._fail() if final else False
        start, end, wait = self._json_at(final, len(self._buf) - len(head))
        if wait:
            return False
        return self._fail() if end is None else self._accept(start, end, end, "content")

    def _in_mistral(self, final: bool) -> bool:
        head = self._buf.lstrip()
        if head.startswith("["):
            return self._open_section("array", self._raw)
        m = syn.MISTRAL_HEAD.match(head)
        if m is None:
            if not final and syn.MISTRAL_HEAD_SO_FAR.fullmatch(head):
                return False
            return self._fail()
        start = len(self._buf) - len(head) + m.end()
        if start == len(self._buf) and not final:
            return False
        if self._buf[start:start + 1] != "{":
            return self._fail()
        _, end, wait = self._json_at(final, start)
        if wait:
            return False
        self._head = m.group(1)
        return self._fail() if end is None else self._accept(start, end, end, "content")

    def _accept(self, start: int, end: int, stop: int, then: str) -> bool:
        """Emits the calls in buf[start:end] and resumes after buf[:stop], or
        fails the section when they are not calls."""
        calls = whole_calls(self._buf[start:end], self._names, self._head)
        if calls is None:
            if self._mode == "json_seq":  # a JSON answer, not a call
                self._say(self._buf[:end])
                self._buf = self._buf[end:]
                return self._open_section("content", "")
            return self._fail()
        self._emit_calls(calls)
        self._buf = self._buf[stop:]
        return self._open_section(then, "")

    def _emit_calls(self, calls: list[tuple[str, str]]) -> None:
        for name, arguments in calls:
            self._out.append(ToolCallDelta(self._index, self._new_id(), name, ""))
            self._out.append(ToolCallDelta(self._index, None, None, arguments))
            self._out.append(ToolCallDone(self._index))
            self._index += 1

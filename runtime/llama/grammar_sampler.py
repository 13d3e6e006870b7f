"""llama.cpp's grammar sampler, kept outside the sampler chain: compiling a
grammar (with llama.cpp's reason when it refuses one), checking and
accepting tokens one at a time, filtering candidates in budgeted slices, and
the lazy start at a trigger."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import tempfile
import threading
from typing import Callable, Iterator

import llama_cpp as lc

from llmctl.errors import InvalidParams, LlmctlError
from llmctl.runtime.llama.grammar_budget import GrammarBudget, GrammarClock
from llmctl.runtime.llama.library import capture_log
from llmctl.runtime.llama.model import LlamaModel

_TOKEN_DATA_SIZE = ctypes.sizeof(lc.llama_token_data)
_grammar_lock = threading.Lock()
# Candidates per grammar filter call: small first, so the time of the first
# call tells whether the whole vocabulary fits the budget before most of it runs.
_FILTER_FIRST, _FILTER_MAX = 256, 8192
# An anchored trigger (one that begins with "^") is looked for only in the
# output's first bytes: its patterns bound every repeat, so a match is
# decided within them (tool_shapes.CALL_OPENING), and later tokens cost nothing.
ANCHOR_WINDOW = 96


@contextlib.contextmanager
def _stderr_captured() -> Iterator[Callable[[], str]]:
    """fd 2 into a temporary file for the duration: llama.cpp's grammar
    parser fprintf's its reason (and the whole grammar) to stderr, and an
    untrusted grammar must neither flood a server's log nor lose the reason."""
    with _grammar_lock, tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield lambda: (tmp.seek(0), tmp.read(4096).decode("utf-8", "replace"))[1]
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _new_grammar(model: LlamaModel, text: str) -> lc.llama_sampler_p:
    """A llama.cpp grammar sampler for `text` (start rule `root`). Raises
    InvalidParams (param "response_format") with llama.cpp's reason."""
    with _stderr_captured() as stderr, capture_log() as log:
        ptr = lc.llama_sampler_init_grammar(model.vocab, text.encode(), b"root")
        if ptr:
            return ptr
        printed = stderr()
    # "parse: error parsing grammar: <reason>\n\n<the grammar>"
    head = printed.split("\n", 1)[0].partition("error parsing grammar: ")[2]
    reason = head or log.last_error("llama.cpp could not compile it")
    raise InvalidParams(f"invalid grammar: {reason[:300]}", param="response_format")


def validate_grammar(model: LlamaModel, text: str) -> None:
    """Compile `text` once and drop it: a cheap check before submitting.
    Raises InvalidParams (param "response_format") for a grammar llama.cpp
    refuses (syntax, undefined rule, no `root`, left recursion)."""
    lc.llama_sampler_free(_new_grammar(model, text))


class Grammar:
    """A grammar sampler kept outside the chain, and laziness done here
    rather than by llama.cpp's lazy grammar: llama.cpp feeds the trigger's
    text to the grammar inside llama_sampler_accept, and text that does not
    fit throws a C++ exception through the C API, which aborts the process.
    Here every token is checked with `allows` before it is accepted.

    A trigger is a literal looked for anywhere in the output, or, when it
    begins with "^", a regular expression matched at the output's start
    (within ANCHOR_WINDOW bytes), as llama.cpp's full-pattern triggers: the
    grammar takes the text from the start of its first group (or of the
    match) on. Text that an anchored match lets through but the grammar
    refuses leaves the output free, never failed: such a pattern guesses.

    Every call into the grammar is timed against the request's budget
    (grammar_budget.py); the methods that call it raise InvalidParams
    (param "response_format") when the request must stop."""

    def __init__(self, model: LlamaModel, text: str, triggers: tuple[str, ...],
                 budget: GrammarBudget):
        self.model = model
        self.clock = GrammarClock(budget)
        self.text = text
        self.ptr: lc.llama_sampler_p | None = _new_grammar(model, text)
        self.triggers = [t.encode() for t in triggers if not t.startswith("^")]
        self.anchored = [re.compile(t.encode()) for t in triggers if t.startswith("^")]
        self.active = not triggers
        self._pending = b""     # recent output while waiting for a trigger
        self._head = b""        # the output's start, while an anchored trigger may match it
        self._one = lc.llama_token_data()
        self._one_arr = lc.llama_token_data_array(ctypes.pointer(self._one), 1, -1, False)

    def allows(self, token: int) -> bool:
        # llama_cpp's stubs type the field as c_int32, but ctypes stores a
        # plain int into it (and returns one): the stub, not the code, is off.
        self._one.id = token  # type: ignore[assignment]
        self._one.logit, self._one.p = 1.0, 0.0
        self._one_arr.size, self._one_arr.selected = 1, -1
        start = self.clock.now()
        lc.llama_sampler_apply(self.ptr, ctypes.byref(self._one_arr))
        self.clock.charge(self.clock.now() - start)
        return self._one.logit != float("-inf")

    def apply(self, cur: lc.llama_token_data_array) -> None:
        """Filter every candidate, in growing slices: the grammar judges each
        candidate alone, and between slices the budget can stop a filter
        that would take too long before most of it has run."""
        base, total = ctypes.addressof(cur.data[0]), cur.size
        done, size = 0, _FILTER_FIRST
        start = mark = self.clock.now()
        while done < total:
            n = min(size, total - done)
            data = ctypes.cast(base + done * _TOKEN_DATA_SIZE, ctypes.POINTER(lc.llama_token_data))
            part = lc.llama_token_data_array(data, n, -1, False)
            lc.llama_sampler_apply(self.ptr, ctypes.byref(part))
            done, size = done + n, min(2 * size, _FILTER_MAX)
            now = self.clock.now()
            self.clock.charge(now - mark)
            self.clock.check_share(now - start, done, total)
            mark = now

    def accept(self, token: int) -> None:
        """Advance past `token`. Raises LlmctlError where the grammar does
        not allow it (llama.cpp itself would abort), and InvalidParams when
        the grammar's cost says the request must stop."""
        if not self.allows(token):
            raise LlmctlError("the output no longer matches the grammar "
                              f"at {self.model.piece(token, True)!r}")
        start = self.clock.now()
        lc.llama_sampler_accept(self.ptr, token)
        self.clock.accepted(self.clock.now() - start)

    def watch(self, token: int) -> None:
        """While lazy: look for a trigger in the output; once one appears, the
        grammar takes the text from it on. Raises LlmctlError when the text
        from a literal trigger already breaks the grammar."""
        piece = self.model.piece(token, special=True)
        if self.anchored and self._watch_head(piece):
            return
        if not self.triggers:
            return
        self._pending += piece
        hits = [i for i in (self._pending.find(t) for t in self.triggers) if i >= 0]
        if not hits:
            keep = max(map(len, self.triggers)) - 1
            self._pending = self._pending[-keep:] if keep else b""
            return
        try:
            text = self._pending[min(hits):].decode()
        except UnicodeDecodeError:
            return      # a character is split across tokens: wait for its end
        self._start(text)

    def _watch_head(self, piece: bytes) -> bool:
        """Whether an anchored trigger matched the output's start (and the
        grammar took over). Past ANCHOR_WINDOW bytes the anchored triggers
        are dropped."""
        self._head += piece
        for pattern in self.anchored:
            m = pattern.match(self._head)
            if m is None:
                continue
            at = m.start(1) if m.re.groups and m.start(1) >= 0 else m.start()
            try:
                text = self._head[at:].decode()
            except UnicodeDecodeError:
                return False    # a character is split across tokens: wait for its end
            self.anchored, self._head = [], b""
            try:
                self._start(text)
            except LlmctlError:
                self._restart()
                return False
            return True
        if len(self._head) > ANCHOR_WINDOW:
            self.anchored, self._head = [], b""
        return False

    def _start(self, text: str) -> None:
        self.active = True
        self._pending = b""
        for t in self.model.tokenize(text, add_special=False, parse_special=False):
            self.accept(t)

    def _restart(self) -> None:
        """A fresh grammar, lazy again: the anchored guess let through text
        the grammar refuses, so the output stays free until a literal trigger."""
        if self.ptr:
            lc.llama_sampler_free(self.ptr)
        self.ptr = None
        self.ptr = _new_grammar(self.model, self.text)
        self.active = False

    def close(self) -> None:
        if getattr(self, "ptr", None):
            lc.llama_sampler_free(self.ptr)
            self.ptr = None

"""A sequence's output as its caller sees it: sampled tokens become text
through UTF-8 reassembly and the stop strings, and each token's
log-probability rides on the text it wrote. Plain Python, kept by the
scheduler beside each running sequence."""

from __future__ import annotations

from llmctl.runtime.engine.detok import StopMatcher, Utf8Decoder
from llmctl.runtime.engine.events import TokenEvent
from llmctl.runtime.engine.logprobs import TokenLogprob
from llmctl.runtime.engine.plan import Sampled
from llmctl.runtime.sampling import SamplingParams


class Output:
    """One sequence's text so far: bytes of a character still incomplete
    and text a stop string may yet claim are held back."""

    def __init__(self, params: SamplingParams):
        self.utf8 = Utf8Decoder()
        self.stops = StopMatcher(params.stop)
        self.logprobs: list[TokenLogprob] = []     # of tokens whose text is held back
        self.matched: str | None = None            # the stop string that ended it

    def feed(self, s: Sampled) -> tuple[TokenEvent | None, bool]:
        """The event for the text `s` releases (None: none yet), and
        whether that text completed a stop string (the output ends, the
        stop string itself unsent)."""
        if s.logprob is not None:
            self.logprobs.append(s.logprob)
        text, hit = self.stops.feed(self.utf8.feed(s.piece))
        event = None
        if text:
            event = TokenEvent(text, s.token, self.logprobs)
            self.logprobs = []
        if hit:
            self.matched = self.stops.matched
            self.stops = StopMatcher(())    # drop held text: it was the stop
            self.logprobs = []              # and these tokens wrote it
        return event, hit

    def tail(self) -> tuple[str, list[TokenLogprob]]:
        """The text still held back at the end, with its tokens' logprobs."""
        text, _ = self.stops.feed(self.utf8.flush())
        text += self.stops.flush()
        return text, (self.logprobs if text else [])

"""Twenty simple prompts a default model must get right: facts, arithmetic
and short instructions, each with a check of its answer. They were written
for choosing the default model and were not used to tune anything else.

A check is a regular expression that the answer (lowercased unless the
check is about case) must match,
and optionally one it must not (a wrong number beside the right one)."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class SimplePrompt:
    """One prompt and what its answer must (and must not) contain."""

    kind: str           # "fact", "arithmetic" or "instruction"
    prompt: str
    must: str           # regex, searched in the lowercased answer
    must_not: str | None = None
    case: bool = False  # match the answer as written, not lowercased
    # When set, the answer is first cut down to this regex's matches, joined
    # by spaces: an order check then ignores list numbering and prose.
    keep: str | None = None

    def passes(self, answer: str) -> bool:
        """Whether `answer` is right. Raises nothing."""
        text = answer if self.case else answer.lower()
        if self.keep is not None:
            text = " ".join(re.findall(self.keep, text))
        if not re.search(self.must, text):
            return False
        return self.must_not is None or not re.search(self.must_not, text)


PROMPTS: tuple[SimplePrompt, ...] = (
    SimplePrompt("fact", "What is the capital of Japan?", r"\btokyo\b"),
    SimplePrompt("fact", "What is the chemical symbol for gold?", r"\bau\b"),
    SimplePrompt("fact", "How many continents are there on Earth?", r"\b(7|seven)\b"),
    SimplePrompt("fact", "Who wrote the play Romeo and Juliet?", r"shakespeare"),
    SimplePrompt("fact", "Which planet is known as the Red Planet?", r"\bmars\b"),
    SimplePrompt("fact", "What is the largest ocean on Earth?", r"\bpacific\b"),
    SimplePrompt("fact", "In which country are the pyramids of Giza?", r"\begypt"),
    SimplePrompt("fact", "Which gas do plants take in from the air to make their food?",
                 r"carbon dioxide|\bco2\b|co₂"),
    SimplePrompt("fact", "How many days are there in a leap year?", r"\b366\b"),
    SimplePrompt("arithmetic", "What is 17 + 25?", r"\b42\b"),
    SimplePrompt("arithmetic", "What is 9 times 8?", r"\b72\b"),
    SimplePrompt("arithmetic", "What is 100 minus 37?", r"\b63\b"),
    SimplePrompt("arithmetic", "What is 144 divided by 12?", r"\b12\b", r"\b(11|13|14)\b"),
    SimplePrompt("arithmetic", "I have 3 apples and buy 5 more. How many apples do I have?",
                 r"\b(8|eight)\b"),
    SimplePrompt("arithmetic", "What is 15% of 200?", r"\b30\b"),
    SimplePrompt("instruction", "Reply with only the word yes, in lowercase.",
                 r"^\W*yes\W*$"),
    SimplePrompt("instruction", "Name the three primary colours of paint, separated by commas.",
                 r"red.*,.*blue.*,.*yellow|red.*,.*yellow.*,.*blue|blue.*,.*red.*,.*yellow|"
                 r"blue.*,.*yellow.*,.*red|yellow.*,.*red.*,.*blue|yellow.*,.*blue.*,.*red"),
    SimplePrompt("instruction", "Translate 'thank you' into Spanish. Reply with the "
                 "translation only.", r"gracias"),
    SimplePrompt("instruction", "Write the word hello in capital letters and nothing else.",
                 r"^\W*HELLO\W*$", case=True),
    SimplePrompt("instruction", "Sort these numbers from smallest to largest: 9, 2, 7.",
                 r"2 7 9$", keep=r"(?<![\d.])[279](?![\d.]*\d)"),
)

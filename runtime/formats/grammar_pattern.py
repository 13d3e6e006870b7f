"""JSON Schema `pattern` as GBNF for the inside of a JSON string.

A pattern is a regular expression over the string's decoded characters,
and a GBNF grammar matches the JSON text, so each character class becomes
the raw characters JSON allows plus the escapes that decode into the class
(`"` is `\\"`, a newline `\\n`). The subset is the regular one: literals and
escapes, classes (`[a-z]`, `[^\\n]`, `\\d`, `\\w`, `\\s` and their negations,
`.`), groups (plain, `(?:)`, named), alternation and the quantifiers
`* + ? {n} {n,} {n,m}` (lazy forms match the same strings). What no
context-free grammar of this kind can run, such as lookaround and
backreferences, is refused by name, as are `^`/`$` anywhere but at the ends.

JSON Schema patterns are not anchored: without `^` (or `$`) any text may
come before (or after) the match.

`Node` trees also serve allOf and length keywords beside a pattern: a
pattern that is one class repeated (`^[^\\n]*$`) intersects exactly with
another such pattern and with minLength/maxLength (see `single_class`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmctl.runtime.formats.grammar_limits import bad

MAX_PATTERN_CHARS = 1_000
MAX_CODE = 0x10FFFF
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "f": "\f", "v": "\v", "0": "\0"}
_JSON_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t",
                 "\b": "\\b", "\f": "\\f"}
_DIGIT = ((ord("0"), ord("9")),)
_WORD = ((ord("0"), ord("9")), (ord("A"), ord("Z")), (ord("_"), ord("_")), (ord("a"), ord("z")))
_SPACE = ((9, 13), (32, 32))
_CLASSES = {"d": (_DIGIT, False), "D": (_DIGIT, True), "w": (_WORD, False), "W": (_WORD, True),
            "s": (_SPACE, False), "S": (_SPACE, True)}


@dataclass(frozen=True)
class CharSet:
    """A set of characters: the ranges listed, or all but them (`negated`)."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False

    def has(self, code: int) -> bool:
        inside = any(a <= code <= b for a, b in self.ranges)
        return inside != self.negated


@dataclass
class Node:
    """A parsed pattern: kind "set" (chars), "seq" or "alt" (parts), or
    "rep" (parts[0] from lo to hi times, hi None for no bound)."""

    kind: str
    chars: CharSet | None = None
    parts: list[Node] = field(default_factory=list)
    lo: int = 1
    hi: int | None = 1


@dataclass
class Pattern:
    """A parsed pattern: its top-level alternatives, each with whether it is
    anchored at the start and at the end."""

    alts: list[tuple[Node, bool, bool]]


def _union(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return tuple(out)


def _complement(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    out, at = [], 0
    for a, b in ranges:
        if a > at:
            out.append((at, a - 1))
        at = b + 1
    if at <= MAX_CODE:
        out.append((at, MAX_CODE))
    return tuple(out)


def intersect(a: CharSet, b: CharSet) -> CharSet:
    """The characters in both sets."""
    ra = _complement(a.ranges) if a.negated else a.ranges
    rb = _complement(b.ranges) if b.negated else b.ranges
    out = [(max(x, y), min(x2, y2)) for x, x2 in ra for y, y2 in rb if max(x, y) <= min(x2, y2)]
    return CharSet(_union(out))


class _Parser:
    """A recursive-descent reader of the subset; every error names the pattern."""

    def __init__(self, text: str, where: str, max_repeat: int):
        self.text, self.i, self.where, self.max_repeat = text, 0, where, max_repeat

    def fail(self, what: str) -> Exception:
        return bad(f"pattern {self.text[:80]!r} at {self.where}: {what}")

    def peek(self) -> str:
        return self.text[self.i] if self.i < len(self.text) else ""

    def take(self) -> str:
        ch = self.peek()
        self.i += 1
        return ch

    def alternation(self) -> Node:
        alts = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.sequence())
        return alts[0] if len(alts) == 1 else Node("alt", parts=alts)

    def top(self) -> list[tuple[Node, bool, bool]]:
        """The top-level alternatives, each with its own anchors."""
        out = []
        while True:
            start = self.peek() == "^"
            self.i += start
            node = self.sequence(top=True)
            end = self.peek() == "$"
            self.i += end
            out.append((node, start, end))
            if self.peek() != "|":
                return out
            self.i += 1

    def sequence(self, top: bool = False) -> Node:
        parts: list[Node] = []
        while self.peek() not in ("", "|", ")"):
            if top and self.peek() == "$" and self.text[self.i + 1:self.i + 2] in ("", "|"):
                break
            if self.peek() in "^$":
                raise self.fail(f"{self.peek()!r} is supported only at the pattern's ends")
            parts.append(self.quantified(self.atom()))
        return parts[0] if len(parts) == 1 else Node("seq", parts=parts)

    def quantified(self, atom: Node) -> Node:
        ch = self.peek()
        if ch not in ("*", "+", "?", "{") or (ch == "{" and not self._is_count()):
            return atom
        self.i += 1
        lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(ch) or self.count()
        if self.peek() == "?":              # lazy: the same strings
            self.i += 1
        if self.peek() in ("*", "+", "?") or (self.peek() == "{" and self._is_count()):
            raise self.fail("a quantifier after a quantifier is not supported")
        return Node("rep", parts=[atom], lo=lo, hi=hi)

    def _is_count(self, at: int | None = None) -> bool:
        """Whether a `{` at `at` (default: here) opens a count; otherwise
        it is a literal, as in JavaScript's patterns."""
        at = self.i if at is None else at
        end = self.text.find("}", at)
        body = self.text[at + 1:end] if end > 0 else ""
        lo, _, hi = body.partition(",")
        return lo.isdigit() and (hi == "" or hi.isdigit())

    def count(self) -> tuple[int, int | None]:
        end = self.text.index("}", self.i)
        lo_text, comma, hi_text = self.text[self.i:end].partition(",")
        self.i = end + 1
        lo = int(lo_text)
        hi = lo if not comma else int(hi_text) if hi_text else None
        if (hi is not None and hi < lo) or max(lo, hi or 0) > self.max_repeat:
            raise self.fail(f"a count must be n <= m <= {self.max_repeat:,}")
        return lo, hi

    def atom(self) -> Node:
        ch = self.take()
        if ch == "(":
            return self.group()
        if ch == "[":
            return Node("set", chars=self.char_class())
        if ch == ".":
            return Node("set", chars=CharSet(((10, 10), (13, 13)), negated=True))
        if ch == "\\":
            return Node("set", chars=self.escape(in_class=False))
        if ch in ("*", "+", "?", ")") or (ch == "{" and self._is_count(self.i - 1)):
            raise self.fail(f"{ch!r} has nothing to repeat or close")
        return Node("set", chars=CharSet(((ord(ch), ord(ch)),)))

    def group(self) -> Node:
        if self.text.startswith("?:", self.i):
            self.i += 2
        elif self.text.startswith("?P<", self.i) or (self.text.startswith("?<", self.i)
                                                    and self.text[self.i + 2:self.i + 3] not in "=!"):
            self.i = self.text.index(">", self.i) + 1 if ">" in self.text[self.i:] else len(self.text)
        elif self.peek() == "?":
            raise self.fail("lookaround and inline flags ((?=, (?!, (?<=, (?i) ...) "
                            "are not supported")
        inner = self.alternation()
        if self.take() != ")":
            raise self.fail("a group is not closed")
        return inner

    def char_class(self) -> CharSet:
        negated = self.peek() == "^"
        self.i += negated
        ranges: list[tuple[int, int]] = []
        first = True
        while first or self.peek() != "]":
            if not self.peek():
                raise self.fail("a character class is not closed")
            first = False
            if self.peek() == "\\":
                self.i += 1
                got = self.escape(in_class=True)
                if got.negated or len(got.ranges) != 1 or got.ranges[0][0] != got.ranges[0][1]:
                    if got.negated:
                        ranges += _complement(got.ranges)
                    else:
                        ranges += got.ranges
                    continue
                lo = got.ranges[0][0]
            else:
                lo = ord(self.take())
            if self.peek() == "-" and self.text[self.i + 1:self.i + 2] not in ("]", ""):
                self.i += 1
                hi_ch = self.take()
                hi = self.escape(in_class=True).ranges[0][0] if hi_ch == "\\" else ord(hi_ch)
                if hi < lo:
                    raise self.fail("a range runs backwards")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        self.i += 1
        return CharSet(_union(ranges), negated)

    def escape(self, in_class: bool) -> CharSet:
        ch = self.take()
        if ch in _CLASSES:
            ranges, negated = _CLASSES[ch]
            return CharSet(ranges, negated)
        if ch in _ESCAPES:
            code = ord(_ESCAPES[ch])
        elif ch in ("x", "u"):
            n = 2 if ch == "x" else 4
            digits = self.text[self.i:self.i + n]
            if len(digits) != n or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise self.fail(f"\\{ch} needs {n} hex digits")
            self.i += n
            code = int(digits, 16)
        elif ch == "b" and in_class:
            code = 8
        elif ch.isalnum() or not ch:
            raise self.fail(f"the escape \\{ch} is not supported (backreferences, \\b, \\p ...)")
        else:
            code = ord(ch)
        return CharSet(((code, code),))


def parse(text: str, where: str, max_repeat: int) -> Pattern:
    """`text` parsed. Raises InvalidParams naming what it cannot express."""
    if not isinstance(text, str):
        raise bad(f"pattern at {where} must be a string")
    if len(text) > MAX_PATTERN_CHARS:
        raise bad(f"pattern at {where} is over {MAX_PATTERN_CHARS:,} characters")
    p = _Parser(text, where, max_repeat)
    alts = p.top()
    if p.i < len(text):
        raise p.fail(f"unexpected {p.peek()!r}")
    return Pattern(alts)


def single_class(p: Pattern) -> tuple[CharSet, int, int | None] | None:
    """(class, min, max) when the anchored pattern is one class repeated."""
    if len(p.alts) != 1 or not (p.alts[0][1] and p.alts[0][2]):
        return None
    node = p.alts[0][0]
    if node.kind == "set" and node.chars is not None:
        return node.chars, 1, 1
    if node.kind == "rep" and node.parts[0].kind == "set" and node.parts[0].chars is not None:
        return node.parts[0].chars, node.lo, node.hi
    return None


def pattern_rule(p: Pattern, char: str) -> str:
    """GBNF for the JSON text of the strings `p` matches somewhere, where
    `char` is the rule for any one JSON-string character."""
    alts = [" ".join(filter(None, ["" if start else f"{char}*", node_rule(node),
                                   "" if end else f"{char}*"]))
            for node, start, end in p.alts]
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


def _class_text(ranges: tuple[tuple[int, int], ...]) -> str:
    def one(code: int) -> str:
        return chr(code) if chr(code).isalnum() and code < 128 else f"\\u{code:04X}" \
            if code <= 0xFFFF else f"\\U{code:08X}"
    return "".join(one(a) if a == b else f"{one(a)}-{one(b)}" for a, b in ranges)


_RAW_OUT = ((0, 0x1F), (ord('"'), ord('"')), (ord("\\"), ord("\\")), (0x7F, 0x7F))


def set_rule(chars: CharSet) -> str:
    """GBNF for one JSON-string character (raw or escaped) in `chars`, or ''
    when JSON can write none of them."""
    raw_out = _union(list(_RAW_OUT))
    if chars.negated:
        raw = CharSet(_union(list(chars.ranges) + list(raw_out)), negated=True)
    else:
        raw = intersect(chars, CharSet(raw_out, negated=True))
    alts = []
    if raw.ranges or raw.negated:
        alts.append(f"[{'^' if raw.negated else ''}{_class_text(raw.ranges)}]")
    for ch, esc in _JSON_ESCAPES.items():
        if chars.has(ord(ch)):
            alts.append('"' + esc.replace("\\", "\\\\").replace('"', '\\"') + '"')
    # Other control characters would need \u escapes; they are left out, so
    # the grammar is at most a little stricter than the pattern.
    return alts[0] if len(alts) == 1 else f"({' | '.join(alts)})" if alts else ""


def node_rule(node: Node) -> str:
    """GBNF for the JSON text of the strings `node` matches."""
    if node.kind == "set":
        assert node.chars is not None
        body = set_rule(node.chars)
        return body or "[^\\x00-\\U0010FFFF]"    # no character: matches nothing
    if node.kind == "seq":
        return "(" + " ".join(_runs(node.parts)) + ")" if node.parts else '""'
    if node.kind == "alt":
        return "(" + " | ".join(node_rule(p) for p in node.parts) + ")"
    inner = node_rule(node.parts[0])
    if (node.lo, node.hi) == (0, None):
        return f"{inner}*"
    if (node.lo, node.hi) == (1, None):
        return f"{inner}+"
    if (node.lo, node.hi) == (0, 1):
        return f"{inner}?"
    return f"{inner}{{{node.lo},{'' if node.hi is None else node.hi}}}" \
        if node.hi != node.lo else f"{inner}{{{node.lo}}}"


def _char(node: Node) -> str | None:
    """The one character a set node matches, when it is one."""
    c = node.chars
    if node.kind != "set" or c is None or c.negated or len(c.ranges) != 1:
        return None
    return chr(c.ranges[0][0]) if c.ranges[0][0] == c.ranges[0][1] else None


def _runs(parts: list[Node]) -> list[str]:
    """A sequence's rules, with runs of single characters as one literal."""
    out: list[str] = []
    run = ""
    for part in [*parts, None]:
        ch = None if part is None else _char(part)
        if ch is not None and (ch in _JSON_ESCAPES or ord(ch) >= 0x20):
            run += ch
            continue
        if run:
            text = "".join(_JSON_ESCAPES.get(c, c) for c in run)
            out.append('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
            run = ""
        if part is not None:
            out.append(node_rule(part))
    return out


def repeat_units(p: Pattern) -> int:
    """What the pattern's counts cost llama.cpp: it makes a rule per step."""
    return sum(_units(node) for node, _, _ in p.alts)


def _units(node: Node) -> int:
    if node.kind == "rep":
        return max(node.lo, node.hi or 0) + _units(node.parts[0])
    return sum(_units(p) for p in node.parts)

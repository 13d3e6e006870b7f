"""GBNF rules as the grammar converter writes them: the JSON primitives,
literals and repetition, and Rules, the table of named rules with the shape
of each that grammar_limits.py checks. Pure string work: no schema is read
here (grammar.py walks schemas and calls these)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from llmctl.runtime.formats import grammar_limits as gl

# Whitespace is at most one space: a model left free to emit newlines and
# indentation can run away in them until max_tokens.
PRIMITIVES = {
    "space": '" "?',
    "char": r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})',
    "string": r'"\"" char* "\"" space',
    "integer": '"-"? ("0" | [1-9] [0-9]{0,15}) space',
    "number": '"-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? space',
    "boolean": '("true" | "false") space',
    "null": '"null" space',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" space (string ":" space value ("," space string ":" space value)*)? "}" space',
    "array": '"[" space (value ("," space value)*)? "]" space',
    "date": '[0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])',
    "time": '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? '
            '("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])',
    "uuid": '[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} '
            '"-" [0-9a-fA-F]{12}',
}
_DEPS = {"string": ["char"], "value": ["object", "array", "string", "number", "boolean", "null"],
         "object": ["string", "value"], "array": ["value"]}
# The characters each primitive's text begins with ("value" is unambiguous:
# its alternatives begin differently).
_FIRST = {"string": '"', "integer": gl.DIGITS, "number": gl.DIGITS, "boolean": "tf", "null": "n",
          "value": gl.JSON_FIRST, "object": "{", "array": "[", "space": " "}
# Location segments left out of rule names, and shorter spellings: a rule's
# name only has to be unique and readable in a dump of the grammar.
_SILENT = {"properties", "anyOf", "oneOf", "$defs", "definitions", "prefixItems", "type"}
_SHORT = {"items": "item", "additionalProperties": "extra"}
# Quoted literals, character classes and repetition counts, skipped when finding the rule names
# a body uses.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\{[0-9,]*\}|([a-zA-Z0-9-]+)')


def json_text(value: Any) -> str:
    """`value` as the JSON text grammars match: ASCII, no space but after a colon."""
    return json.dumps(value, ensure_ascii=True, separators=(",", ": "))


def literal(value: Any) -> str:
    """A GBNF literal matching `value` written as compact JSON."""
    return '"' + json_text(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def repeat(item: str, lo: int, hi: int | None) -> str:
    """`item` lo..hi times, comma-separated; '' when hi is 0."""
    if hi == 0:
        return ""
    if lo == 0:
        return f"({repeat(item, 1, hi)})?"
    rest = "" if hi == 1 else f' ("," space {item}){{{lo - 1},{"" if hi is None else hi - 1}}}'
    return item + rest


class Rules:
    """The rules of one grammar, the shape of each for grammar_limits'
    checks, and the work budget that adding rules spends. `prefix` starts
    every rule name."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.rules: dict[str, str] = {"space": PRIMITIVES["space"]}
        self.shapes: dict[str, gl.Shape] = {"space": gl.Shape(first=frozenset(" "))}
        self.budget = gl.Budget()
        self.taken: dict[str, int] = {}                 # next free suffix per rule name

    def grammar(self) -> str:
        """The GBNF text of all rules, in the order they were added."""
        return "\n".join(f"{name} ::= {body}" for name, body in self.rules.items())

    def name(self, at: str, suffix: str = "") -> str:
        """A rule name for the schema at location `at`."""
        segs = [_SHORT.get(s, s) for s in at.split("/") if s and s not in _SILENT]
        return "-".join(filter(None, [self.prefix, *segs, suffix])) or "root"

    def add(self, name: str, body: str, shape: gl.Shape | None = None) -> str:
        """Add a rule under a free name like `name`; return that name.
        "root" is kept for the start rule, which callers set themselves.
        Raises InvalidParams when the budget is spent."""
        self.budget.rule(body)
        base = re.sub(r"[^a-zA-Z0-9-]+", "-", name).strip("-") or "r"
        i = self.taken.get(base, 0)
        key = base if i == 0 else f"{base}-{i}"
        while key in self.rules or key in PRIMITIVES or key == "root":
            i += 1
            key = f"{base}-{i}"
        self.taken[base] = i + 1
        self.rules[key] = body
        self.shapes[key] = replace(shape or gl.Shape(), parts=self.uses(body))
        return key

    def uses(self, body: str) -> tuple[str, ...]:
        """The rules that `body` names, in order, once each."""
        names = (m.group(1) for m in _TOKENS.finditer(body))
        return tuple(dict.fromkeys(n for n in names if n and n in self.rules))

    def primitive(self, name: str) -> str:
        """The primitive `name` (a key of PRIMITIVES), added with the ones it uses."""
        if name not in self.rules:
            self.rules[name] = PRIMITIVES[name]
            for dep in _DEPS.get(name, []):
                self.primitive(dep)
            # After the dependencies, so that `uses` finds them all.
            self.shapes[name] = gl.Shape(first=frozenset(_FIRST.get(name, "")),
                                         parts=self.uses(PRIMITIVES[name]))
        return name

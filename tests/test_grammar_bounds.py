"""Number bounds, `pattern` and long lengths in schemas, checked against
llama.cpp's own grammar engine: each grammar is compiled by llama.cpp and
fed values token by token, and what it accepts must be exactly what the
schema accepts (Python's arithmetic and `re` give the truth)."""

from __future__ import annotations

import json
import random
import re
from decimal import Decimal

import pytest

from conftest import smollm2_file
from llmctl.errors import InvalidParams
from llmctl.runtime.formats.grammar import json_schema_grammar, tool_call_grammar
from llmctl.runtime.llama import LlamaModel, validate_grammar
from llmctl.runtime.llama.grammar_budget import GrammarBudget
from llmctl.runtime.llama.grammar_sampler import Grammar

SAFE = 2**53 - 1
CLAUDE_CODE = "tests/fixtures/agent-requests/claude-code-2.1.328-messages.json"


@pytest.fixture(scope="module")
def vocab():
    return LlamaModel(smollm2_file(), vocab_only=True)


class Checker:
    """One schema's grammar in llama.cpp, asked about JSON texts."""

    def __init__(self, model: LlamaModel, schema: dict):
        self.model, self.text = model, json_schema_grammar(schema)

    def accepts(self, text: str) -> bool:
        g = Grammar(self.model, self.text, (), GrammarBudget())
        for t in self.model.tokenize(text, add_special=False, parse_special=False):
            if not g.allows(t):
                return False
            g.accept(t)
        return g.allows(self.model.eos)


def _inside(v: Decimal, schema: dict) -> bool:
    checks = [("minimum", lambda b: v >= b), ("maximum", lambda b: v <= b),
              ("exclusiveMinimum", lambda b: v > b), ("exclusiveMaximum", lambda b: v < b)]
    return all(test(Decimal(str(schema[k]))) for k, test in checks if k in schema)


INTEGER_SCHEMAS = [
    {"minimum": 0, "maximum": SAFE}, {"minimum": -SAFE, "maximum": SAFE},
    {"exclusiveMinimum": 0, "maximum": SAFE}, {"minimum": 1000, "maximum": 3600000},
    {"minimum": -120, "maximum": -7}, {"minimum": -5, "exclusiveMaximum": 123},
    {"minimum": 7, "maximum": 7}, {"minimum": 0.5, "maximum": 10.5}, {"minimum": 10},
    {"maximum": -10}, {"minimum": 199, "maximum": 2001}, {"minimum": 1, "maximum": 9},
]


@pytest.mark.parametrize("bounds", INTEGER_SCHEMAS, ids=lambda b: json.dumps(b))
def test_integer_bounds_are_exact(vocab, bounds):
    schema = {"type": "integer", **bounds}
    check = Checker(vocab, schema)
    rng = random.Random(json.dumps(bounds))
    edges = [int(Decimal(str(b))) + d for b in bounds.values() for d in (-2, -1, 0, 1, 2)]
    probes = edges + [0, -1, 1, 9, 10, 99, 100, SAFE, SAFE + 1, -SAFE, -SAFE - 1, 10**16]
    probes += [rng.randint(-10**7, 10**7) for _ in range(12)] + [rng.randint(-SAFE, SAFE)
                                                                 for _ in range(6)]
    wrong = [v for v in probes
             if check.accepts(str(v)) != (_inside(Decimal(v), schema) and abs(v) < 10**16)]
    assert not wrong
    assert not check.accepts("01") and not check.accepts("-0") and not check.accepts("1.5")


NUMBER_SCHEMAS = [
    {"minimum": 1000, "maximum": 3600000}, {"exclusiveMinimum": 0},
    {"minimum": -3, "exclusiveMaximum": 2}, {"exclusiveMinimum": -1, "exclusiveMaximum": 0},
    {"minimum": 0, "maximum": 1},
]
NUMBER_PROBES = ["0", "0.0", "0.5", "1", "1.0", "1.01", "-0.5", "-1", "-1.0", "-2.999", "-3",
                 "-3.0", "-3.001", "2", "1.999", "2.0", "999.99", "1000", "1000.0", "3600000",
                 "3600000.00", "3600000.01", "123456.789", "-0.0001", "0.0001", "5e3", "7"]


@pytest.mark.parametrize("bounds", NUMBER_SCHEMAS, ids=lambda b: json.dumps(b))
def test_number_bounds_are_exact(vocab, bounds):
    schema = {"type": "number", **bounds}
    check = Checker(vocab, schema)
    # Bounded numbers are written without an exponent.
    wrong = [p for p in NUMBER_PROBES
             if check.accepts(p) != ("e" not in p and _inside(Decimal(p), schema))]
    assert not wrong


PATTERNS = ["^wf_[a-z0-9-]{6,}$", "sit dolor", "^[^\\n\\r]*$", "^[\\s\\S]{0,12}$",
            '^a"b\\\\c$', "^(ab|cd)+x?$", "^\\d{3}-\\d{2}$", "^[A-Z][a-z]*( [A-Z][a-z]*)*$",
            "b$", "^\\w+@\\w+\\.com$", "^(?:[^a]|a{2})*$", "^.{2,4}$", "ab|^\\{$", "^a|b$|^c$"]
ALPHABET = 'ab cdwf_x-019AZ."\\\n@.com{},'


def _truth(pattern: str, s: str) -> bool:
    """JSON Schema's reading: anchored only where ^ and $ say, `.` never a
    line break, `$` only at the very end (Python's also matches before a
    final newline; \\Z is the very end)."""
    out, in_class, i = [], False, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]" or out[-1] == "["
        elif ch == "[":
            in_class = True
        out.append({".": "[^\\n\\r]", "$": "\\Z"}.get(ch, ch) if not in_class else ch)
        i += 1
    return re.search("".join(out), s) is not None


@pytest.mark.parametrize("pattern", PATTERNS)
def test_patterns_match_what_the_regex_matches(vocab, pattern):
    check = Checker(vocab, {"type": "string", "pattern": pattern})
    rng = random.Random(pattern)
    samples = ["", "wf_abc-12", "sit dolor", "a\nb", "abcdx", "123-45", "Abc Def", "q@w.com",
               'a"b\\c', "aab", "{", "x{,3}"]
    samples += ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 14)))
                for _ in range(40)]
    wrong = [s for s in samples
             if check.accepts(json.dumps(s, ensure_ascii=False)) != _truth(pattern, s)]
    assert not wrong


def test_one_class_patterns_intersect_with_each_other_and_lengths(vocab):
    schema = {"type": "string", "maxLength": 9,
              "allOf": [{"pattern": "^[^\\n\\r]*$"}, {"pattern": "^[\\s\\S]{0,300}$"}]}
    check = Checker(vocab, schema)
    for s, ok in [("", True), ("hello you", True), ("hello you!", False), ("a\nb", False),
                  ('say "hi"', True), ("tab\there", True)]:
        assert check.accepts(json.dumps(s)) is ok, s
    with pytest.raises(InvalidParams, match="cannot be combined"):
        json_schema_grammar({"type": "string", "pattern": "^ab+$", "maxLength": 4})


@pytest.mark.parametrize("lo,hi", [(0, 2500), (1500, None), (1001, 1001), (0, 524288)])
def test_long_lengths_are_chunked_exactly(vocab, lo, hi):
    schema = {"type": "string", "minLength": lo, **({} if hi is None else {"maxLength": hi})}
    check = Checker(vocab, schema)
    top = 2600 if hi is None or hi > 3000 else hi + 1
    for n in sorted({0, 1, 999, 1000, 1001, 1002, 1499, 1500, 1999, 2000, 2001, 2500, top}):
        assert check.accepts(json.dumps("a" * n)) is (n >= lo and (hi is None or n <= hi)), n


@pytest.mark.parametrize("schema,named", [
    ({"type": "string", "pattern": "^(?=a)a$"}, "lookaround"),
    ({"type": "string", "pattern": "^(a)\\1$"}, "\\1"),
    ({"type": "string", "pattern": "^a$b"}, "only at the pattern's ends"),
    ({"type": "string", "pattern": "^[ab"}, "not closed"),
    ({"type": "string", "pattern": "^a{5000}$"}, "count"),
    ({"type": "number", "minimum": 0.5}, "whole-number"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "admit no value"),
    ({"type": "number", "exclusiveMinimum": 1, "maximum": 1}, "admit no value"),
    ({"type": "integer", "minimum": "0"}, "finite number"),
    ({"type": "string", "maxLength": 2_000_000}, "maxLength"),
])
def test_what_cannot_be_enforced_is_refused_by_name(schema, named):
    with pytest.raises(InvalidParams, match=re.escape(named)):
        json_schema_grammar(schema)


def test_claude_codes_tools_convert_and_compile(vocab):
    tools = json.loads(open(CLAUDE_CODE).read())["tools"]
    grammar = tool_call_grammar([{"name": t["name"], "parameters": t["input_schema"]}
                                 for t in tools], openings=True)
    validate_grammar(vocab, grammar)


PATTERN_ATOMS = ["a", "b", ".", "\\d", "\\w", "\\s", "[ab]", "[^a]", "(", ")", "|", "*", "+",
                 "?", "{2}", "{1,3}", "^", "$", "\\", "[", "]", "-", "(?:", "\\n", '"', "{"]


def test_fuzzed_patterns_convert_or_are_refused_and_agree(vocab):
    """Random patterns: each is refused with InvalidParams or gives a
    grammar llama.cpp compiles and that agrees with the regex."""
    rng = random.Random(7)
    agreed = 0
    for _ in range(150):
        pattern = "".join(rng.choice(PATTERN_ATOMS) for _ in range(rng.randint(1, 8)))
        try:
            text = json_schema_grammar({"type": "string", "pattern": pattern})
        except InvalidParams:
            continue
        validate_grammar(vocab, text)
        try:
            re.compile(pattern)
        except re.error:
            continue
        check = Checker.__new__(Checker)
        check.model, check.text = vocab, text
        for _ in range(4):
            s = "".join(rng.choice("ab1 _\n") for _ in range(rng.randint(0, 5)))
            assert check.accepts(json.dumps(s)) == _truth(pattern, s), (pattern, s)
        agreed += 1
    assert agreed > 20


def test_property_names_bound_the_extra_keys(vocab):
    # Claude Code's TaskCreate tool has metadata: {"propertyNames": {...},
    # "additionalProperties": {...}}; its keys follow propertyNames.
    check = Checker(vocab, {"type": "object", "additionalProperties": {"type": "integer"},
                            "propertyNames": {"type": "string", "pattern": "^[a-z]+$",
                                              "maxLength": 5}})
    for text in ('{"abc": 1}', '{"a": 1, "bcd": 2}', "{}"):
        assert check.accepts(text), text
    for text in ('{"ABC": 1}', '{"abcdef": 1}', '{"a1": 2}'):
        assert not check.accepts(text), text
    closed = Checker(vocab, {"type": "object", "properties": {"a": {"type": "integer"}},
                             "propertyNames": False})
    assert closed.accepts("{}") and not closed.accepts('{"a": 1}')
    with pytest.raises(InvalidParams, match="propertyNames"):
        json_schema_grammar({"type": "object", "propertyNames": {"type": "integer"}})

"""String schemas as GBNF: formats, minLength/maxLength and `pattern`
(grammar_pattern.py), and repetition longer than llama.cpp runs in one count.

llama.cpp refuses a count over 2,000 and makes a rule per step of one, so a
long bound is written in chunks: `maxLength: 524288` (Claude Code sends it)
becomes up to 524 runs of 1,000 characters and a shorter tail, exactly the
same strings at a cost of about 1,800 steps instead of half a million."""

from __future__ import annotations

from llmctl.runtime.formats import grammar_limits as gl
from llmctl.runtime.formats import grammar_pattern as gp
from llmctl.runtime.formats.grammar_limits import bad
from llmctl.runtime.formats.grammar_rules import Rules

CHUNK = 1_000                   # llama.cpp refuses repetitions over 2000
MAX_LENGTH = CHUNK * CHUNK      # runs of runs: one level of chunks
FORMATS = {"date": "date", "time": "time", "date-time": 'date "T" time', "uuid": "uuid"}
_STRING = gl.Shape(first=frozenset('"'))


def length(schema: dict, key: str, where: str) -> int | None:
    """minLength or maxLength of `schema`. Raises InvalidParams unless it
    is an integer in [0, MAX_LENGTH]."""
    value = schema.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 0 <= value <= MAX_LENGTH):
        raise bad(f"{key} at {where} must be an integer in [0, {MAX_LENGTH:,}], "
                  f"got {str(value)[:60]}")
    return value


def chunked(item: str, lo: int, hi: int | None) -> tuple[str, int]:
    """`item` lo..hi times (hi None: no bound) as GBNF, and the steps it
    costs llama.cpp. Counts over CHUNK are written as runs of CHUNK, with
    the optional part split so that each length parses one way."""
    if max(lo, hi or 0) <= CHUNK:
        if hi == lo:
            return f"{item}{{{lo}}}", lo
        return f"{item}{{{lo},{'' if hi is None else hi}}}", max(lo, hi or 0)
    run = f"({item}{{{CHUNK}}})"
    runs, extra = divmod(lo, CHUNK)
    parts = [f"{run}{{{runs}}}" if runs else "", f"{item}{{{extra}}}" if extra else ""]
    units = CHUNK + runs + extra
    if hi is None:
        parts.append(f"{item}*")
    elif hi > lo:
        q, r = divmod(hi - lo, CHUNK)
        if q == 0:
            parts.append(f"{item}{{0,{r}}}")
        else:
            # Fewer than q whole runs and any shorter tail, or exactly q runs
            # and a tail up to r: the two never match the same length.
            fewer = f"{run}{{0,{q - 1}}} " if q > 1 else ""
            parts.append(f"({fewer}{item}{{0,{CHUNK - 1}}} | {run}{{{q}}} {item}{{0,{r}}})")
            units += q + CHUNK + r
    return " ".join(p for p in parts if p), units


def string_rule(rules: Rules, schema: dict, at: str) -> str:
    """The rule for a string schema at location `at`. Raises InvalidParams
    for bounds out of range, a pattern outside grammar_pattern's subset,
    or a pattern with other string keywords it cannot be combined with."""
    where = at.lstrip("/") or "root"
    fmt = schema.get("format")
    patterns = schema.get("pattern")
    lo, hi = length(schema, "minLength", where) or 0, length(schema, "maxLength", where)
    if hi is not None and hi < lo:
        raise bad(f"maxLength < minLength at {where}")
    if patterns is not None:
        if fmt in FORMATS:
            raise bad(f"format {fmt!r} together with pattern at {where} is not supported")
        return _pattern_rule(rules, patterns, lo, hi, at)
    if fmt in FORMATS:
        for dep in ("date", "time", "uuid"):
            if dep in FORMATS[fmt]:
                rules.primitive(dep)
        return rules.add(rules.name(at), rf'"\"" {FORMATS[fmt]} "\"" space', _STRING)
    if lo == 0 and hi is None:
        return rules.primitive("string")
    body, units = chunked(rules.primitive("char"), lo, hi)
    rules.budget.repeat(units)
    return rules.add(rules.name(at), rf'"\"" {body} "\"" space', _STRING)


def _pattern_rule(rules: Rules, patterns: str | list, lo: int, hi: int | None, at: str) -> str:
    where = at.lstrip("/") or "root"
    texts = patterns if isinstance(patterns, list) else [patterns]
    parsed = [gp.parse(t, where, CHUNK) for t in texts]
    units = sum(gp.repeat_units(p) for p in parsed)
    if len(parsed) == 1 and lo == 0 and hi is None:
        body = gp.pattern_rule(parsed[0], rules.primitive("char"))
    else:
        body, more = _intersection(parsed, lo, hi, where)
        units += more
    rules.budget.repeat(units)
    return rules.add(rules.name(at), rf'"\"" {body} "\"" space', _STRING)


def _intersection(parsed: list[gp.Pattern], lo: int, hi: int | None,
                  where: str) -> tuple[str, int]:
    """Several patterns, or one with minLength/maxLength: exact when each is
    one character class repeated, where the classes intersect and the
    counts narrow."""
    chars = gp.CharSet((), negated=True)
    for p in parsed:
        one = gp.single_class(p)
        if one is None:
            raise bad(f"the pattern at {where} cannot be combined with another pattern or "
                      "with minLength/maxLength: only an anchored pattern that is one "
                      "character class repeated (like ^[^\\n]{0,80}$) can")
        cls, p_lo, p_hi = one
        chars = gp.intersect(chars, cls)
        lo = max(lo, p_lo)
        hi = p_hi if hi is None else hi if p_hi is None else min(hi, p_hi)
    if hi is not None and hi < lo:
        raise bad(f"the patterns and lengths at {where} admit no string")
    item = gp.set_rule(chars)
    if not item:
        raise bad(f"the patterns at {where} admit no character")
    return chunked(item, lo, hi)

"""Bounded integers and numbers as GBNF: `minimum`, `maximum`,
`exclusiveMinimum` and `exclusiveMaximum` enforced exactly, digit by digit,
rather than checked after the fact (a model that writes 0 for a bound of 1
cannot take it back).

A range of whole numbers is split into runs that share a prefix and then
range over one digit and any digits after it ("1" [3-9] [0-9]{2} | ...), as
regex range generators do. A bounded `number` adds a fraction: every whole
part strictly inside the bounds takes any fraction; the bound itself only
the fraction that keeps it inside (none past an inclusive maximum, any but
zero above an exclusive minimum). Bounded numbers are written without an
exponent. Bounds that are not whole numbers are refused for `number`
(rounded inward for `integer`, where that is exact).

The integer primitive allows 16 digits, so bounds are clamped to +-LIMIT:
JavaScript's safe-integer bounds (2^53 - 1), which agents send for "any
integer", fit inside it. Pure string work."""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmctl.runtime.formats.grammar_limits import bad

LIMIT = 10**16 - 1
FRACTION = '("." [0-9]{1,16})?'
KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


@dataclass(frozen=True)
class Bounds:
    """The closed or open ends of a range; None is unbounded."""

    lo: int | None = None
    lo_open: bool = False
    hi: int | None = None
    hi_open: bool = False


def _bound(schema: dict, key: str, where: str) -> float | None:
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad(f"{key} at {where} must be a finite number, got {str(value)[:60]}")
    return value


def _ends(schema: dict, where: str) -> tuple[float | None, bool, float | None, bool]:
    """(low, open?, high, open?) from the four keywords, the tighter bound
    winning where both kinds are given; draft 4's boolean exclusive flags
    mark minimum/maximum themselves as open."""
    lo, hi = _bound(schema, "minimum", where), _bound(schema, "maximum", where)
    lo_open = hi_open = False
    for key, is_lo in (("exclusiveMinimum", True), ("exclusiveMaximum", False)):
        flag = schema.get(key)
        if isinstance(flag, bool):
            if is_lo:
                lo_open = flag and lo is not None
            else:
                hi_open = flag and hi is not None
            continue
        value = _bound(schema, key, where)
        if value is None:
            continue
        if is_lo and (lo is None or value >= lo):
            lo, lo_open = value, True
        elif not is_lo and (hi is None or value <= hi):
            hi, hi_open = value, True
    return lo, lo_open, hi, hi_open


def bounds(schema: dict, kind: str, where: str) -> Bounds | None:
    """The range a schema's bound keywords give an integer or number, or
    None when it sets none. Raises InvalidParams for a bound that is not a
    finite number, a `number` bound that is not whole, or an empty range."""
    if not any(k in schema for k in KEYS):
        return None
    lo, lo_open, hi, hi_open = _ends(schema, where)
    if kind == "integer":
        # Whole numbers only: an open or fractional end moves to the next
        # whole number inside, which is exactly the same set.
        ilo = None if lo is None else (math.floor(lo) + 1 if lo_open else math.ceil(lo))
        ihi = None if hi is None else (math.ceil(hi) - 1 if hi_open else math.floor(hi))
        out = Bounds(_clamp(ilo), False, _clamp(ihi), False)
    else:
        for key, value in (("minimum", lo), ("maximum", hi)):
            if value is not None and value != int(value):
                raise bad(f"a {key} of {value} on a number at {where} cannot be enforced: "
                          "only whole-number bounds are (use a whole number, or scale the "
                          "value to an integer)")
        out = Bounds(_clamp(lo), lo_open, _clamp(hi), hi_open)
    if _empty(out):
        raise bad(f"the bounds at {where} admit no value")
    return out


def _clamp(value: float | None) -> int | None:
    return None if value is None else max(-LIMIT, min(LIMIT, int(value)))


def _empty(b: Bounds) -> bool:
    if b.lo is None or b.hi is None:
        return False
    return b.lo > b.hi or (b.lo == b.hi and (b.lo_open or b.hi_open))


def integer_body(b: Bounds) -> tuple[str, int]:
    """The GBNF body for the integers in `b` (closed ends), and how many
    alternatives it holds (each can be a live parse)."""
    lo = -LIMIT if b.lo is None else b.lo
    hi = LIMIT if b.hi is None else b.hi
    alts = _whole(max(lo, 0), hi) if hi >= 0 else []
    if lo < 0:
        alts += [f'"-" ({" | ".join(_whole(max(1, -hi), -lo))})']
    return f"({' | '.join(alts)}) space", len(alts) + 1


def number_body(b: Bounds) -> tuple[str, int]:
    """The GBNF body for the numbers in `b`, as integer_body does."""
    alts: list[str] = []
    if b.hi is None or b.hi > 0 or (b.hi == 0 and not b.hi_open):
        if b.lo is None or b.lo < 0:
            alts += _magnitudes(0, False, b.hi, b.hi_open)
        else:
            alts += _magnitudes(b.lo, b.lo_open, b.hi, b.hi_open)
    if b.lo is None or b.lo < 0:
        # -v for v in the negative part: its magnitude runs from the other
        # end; zero itself is the positive side's, so it is open here.
        top = None if b.lo is None else -b.lo
        if b.hi is not None and b.hi < 0:
            neg = _magnitudes(-b.hi, b.hi_open, top, b.lo_open)
        else:
            neg = _magnitudes(0, True, top, b.lo_open)
        if neg:
            alts.append(f'"-" ({" | ".join(neg)})')
    return f"({' | '.join(alts)}) space", len(alts) + 1


def _magnitudes(a: int, a_open: bool, b: int | None, b_open: bool) -> list[str]:
    """Alternatives for the non-negative numbers m with a < m (or <=) and
    m < b (or <=, or no upper bound when b is None)."""
    top = LIMIT if b is None else b - 1     # whole parts that take any fraction
    out: list[str] = []
    first = a + 1 if a_open else a
    if first <= top:
        out.append(f"({' | '.join(_whole(first, top))}) {FRACTION}")
    if a_open and (b is None or a < b):
        out.append(f'"{a}" "." [0-9]{{0,15}} [1-9]')    # just above a
    if b is not None and not b_open and (a < b or not a_open):
        out.append(f'"{b}" ("." "0"{{1,16}})?')          # b itself, no further
    return out


def _whole(a: int, b: int) -> list[str]:
    """Alternatives for the whole numbers a..b (0 <= a), written without
    leading zeros: one per run of equal-length numbers that differ in one
    digit, with the lengths that are wholly inside merged into one."""
    out: list[str] = []
    if a > b:
        return out
    if a == 0:
        out.append('"0"')
        a = 1
    full: list[int] = []                    # lengths 2.. whose every number is inside
    for n in range(len(str(a)), len(str(b)) + 1):
        lo, hi = max(a, 10 ** (n - 1)), min(b, 10**n - 1)
        if lo > hi:
            continue
        if lo == 10 ** (n - 1) and hi == 10**n - 1:
            full.append(n)
            continue
        out += _same_length(str(lo), str(hi))
    if full:
        k, m = full[0] - 1, full[-1] - 1
        out.append("[1-9]" + ("" if m == 0 else f" [0-9]{{{k},{m}}}" if k != m else f" [0-9]{{{k}}}"))
    return out


def _digit_class(lo: str, hi: str) -> str:
    return f'"{lo}"' if lo == hi else f"[{lo}-{hi}]"


def _same_length(s: str, t: str) -> list[str]:
    """Alternatives for the numbers s..t written with len(s) == len(t) digits."""
    if s == t:
        return [f'"{s}"']
    i = next(k for k in range(len(s)) if s[k] != t[k])
    prefix, rest = s[:i], len(s) - i - 1
    head = f'"{prefix}" ' if prefix else ""
    tail = f" [0-9]{{{rest}}}" if rest else ""
    low_full, high_full = s[i + 1:] == "0" * rest, t[i + 1:] == "9" * rest
    out = []
    if not low_full:
        out += [f'{head}"{s[i]}" {x}' for x in _same_length(s[i + 1:], "9" * rest)]
    first = s[i] if low_full else chr(ord(s[i]) + 1)
    last = t[i] if high_full else chr(ord(t[i]) - 1)
    if first <= last:
        out.append(f"{head}{_digit_class(first, last)}{tail}")
    if not high_full:
        out += [f'{head}"{t[i]}" {x}' for x in _same_length("0" * rest, t[i + 1:])]
    return out

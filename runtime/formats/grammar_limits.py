"""Bounds on converting a JSON Schema to GBNF, and the checks on the finished
rule graph that keep llama.cpp's grammar engine from exponential work.

Two kinds of limit. The work budget (`Budget`) is charged while the converter
walks, so a schema that would take too long fails as soon as it passes a
bound, not after the work is done. The graph checks (`check_rules`) run on
the rules of one finished schema:

- a `$ref` cycle that returns to itself before any character is matched
  (`a: {"$ref": a}`, an anyOf member that is its own ref) is left recursion,
  which no grammar can run;
- inside a recursive `$ref`, a union whose alternatives can begin with the
  same character and both lead back into the recursion makes llama.cpp keep
  one parse stack per live alternative at every level, so the stacks
  multiply with nesting depth (8 alternatives starting with `[` grow the
  work with each `[`: docs/limits.md has the figures);
- outside recursion the same multiplication is bounded by the schema's
  depth, but an anyOf of 8 arrays of an anyOf of 8 arrays ... still grows as
  8^depth, so the number of parses that can be live at once is bounded too.

The numbers follow OpenAI's structured-output limits where they have one
(https://platform.openai.com/docs/guides/structured-outputs#supported-schemas:
5,000 object properties, 1,000 enum values in total, 120,000 characters of
names and values, which MAX_SCHEMA_CHARS already bounds), and elsewhere
where llama.cpp's cost to compile and run a grammar stays small: the figures
and how to reproduce them are in docs/measurements.md."""

from __future__ import annotations

from dataclasses import dataclass

from llmctl.errors import InvalidParams

MAX_SCHEMA_CHARS = 100_000      # one schema as compact JSON
MAX_DEPTH = 32                  # nesting, counting $ref and allOf steps
MAX_NODES = 20_000              # schema nodes visited, merges included
MAX_PROPERTIES = 5_000          # object properties visited (OpenAI: 5,000)
MAX_ENUM_VALUES = 1_000         # distinct enum/const values (OpenAI: 1,000)
MAX_ALTERNATIVES = 500          # in one anyOf/oneOf
MAX_RULES = 10_000
MAX_GRAMMAR_CHARS = 400_000     # bounds llama.cpp's compile time
MAX_REPEAT_UNITS = 100_000      # sum of {m,n} bounds: llama.cpp makes a rule per step
MAX_LIVE_PARSES = 1_024         # bounds the grammar's work per generated token

DIGITS = frozenset("-0123456789")
SP = None                       # in a lead: the optional space between tokens
MAX_LEAD = 24
JSON_FIRST = frozenset('{["tfn') | DIGITS


def text_lead(texts: list[str]) -> tuple:
    """The lead of a choice of literal texts: at each position, the
    characters any of them has there, as far as the shortest goes."""
    n = min(min(map(len, texts)), MAX_LEAD)
    return tuple(frozenset(t[i] for t in texts) for i in range(n))


def bad(message: str) -> InvalidParams:
    """The converter's error: param response_format (tool_call_grammar
    rewrites it for tools)."""
    return InvalidParams(f"response_format: {message}", param="response_format")


class Budget:
    """Counts the converter's work; each charge raises InvalidParams as soon
    as its bound is passed."""

    def __init__(self) -> None:
        self.nodes = self.properties = self.enum_values = 0
        self.rules = self.chars = self.repeats = 0

    def node(self, where: str) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise bad(f"the schema needs over {MAX_NODES:,} steps to convert (at {where}); "
                      "anyOf, type lists and allOf repeat the keywords beside them")

    def props(self, n: int, where: str) -> None:
        self.properties += n
        if self.properties > MAX_PROPERTIES:
            raise bad(f"the schema has over {MAX_PROPERTIES:,} object properties (at {where})")

    def enum(self, n: int, where: str) -> None:
        self.enum_values += n
        if self.enum_values > MAX_ENUM_VALUES:
            raise bad(f"the schema has over {MAX_ENUM_VALUES:,} enum/const values "
                      f"in total (at {where})")

    def alternatives(self, n: int, where: str) -> None:
        if n > MAX_ALTERNATIVES:
            raise bad(f"anyOf/oneOf at {where} has {n:,} alternatives "
                      f"(at most {MAX_ALTERNATIVES:,})")

    def rule(self, body: str) -> None:
        self.rules += 1
        self.chars += len(body) + 8
        if self.rules > MAX_RULES:
            raise bad(f"the schema needs over {MAX_RULES:,} grammar rules")
        if self.chars > MAX_GRAMMAR_CHARS:
            raise bad(f"the schema needs over {MAX_GRAMMAR_CHARS:,} characters of grammar")

    def repeat(self, n: int) -> None:
        self.repeats += n
        if self.repeats > MAX_REPEAT_UNITS:
            raise bad(f"the schema's minItems/maxItems/minLength/maxLength add up to over "
                      f"{MAX_REPEAT_UNITS:,}")


@dataclass(frozen=True)
class Shape:
    """What the checks need to know about one rule. `first`: the characters
    its text can begin with (for a literal-led rule). `alts`: a union's
    alternatives; `target`/`ref`: a $ref rule, the rule and $ref it names.
    `groups`: sets of rules that can be live at once after the same text,
    each (what, ((label, rule), ...)). `parts`: every rule the body names.
    `what`: where a union is, for messages ("anyOf at $defs/n")."""

    first: frozenset = frozenset()
    alts: tuple[str, ...] | None = None
    target: str | None = None
    ref: str = ""
    groups: tuple = ()
    parts: tuple[str, ...] = ()
    what: str = ""
    live: int = 1       # parses alive at once inside it (an enum: its values)
    lead: tuple = ()    # the text it must begin with: sets of characters, SP for a space


def check_rules(shapes: dict[str, Shape], start: str) -> None:
    """Refuse the rules reachable from `start` when they hold a $ref cycle
    that consumes nothing, an ambiguous union on a recursion path, or more
    live parses than MAX_LIVE_PARSES. Raises InvalidParams naming where."""
    order = _reachable(shapes, start)
    first = _first_sets(shapes, order)
    comp = _components(shapes, order)
    _recursive_ambiguity(shapes, order, first, comp)
    _live_parses(shapes, order, first)


def _reachable(shapes: dict[str, Shape], start: str) -> list[str]:
    seen, todo = {start}, [start]
    while todo:
        for p in shapes[todo.pop()].parts:
            if p not in seen:
                seen.add(p)
                todo.append(p)
    return sorted(seen)


def _left(shape: Shape) -> tuple[str, ...]:
    """The rules a rule's text can begin with, before any character."""
    if shape.alts is not None:
        return shape.alts
    return (shape.target,) if shape.target is not None else ()


def _first_sets(shapes: dict[str, Shape], order: list[str]) -> dict[str, frozenset]:
    """Each rule's first characters; a loop along _left is a $ref cycle."""
    first: dict[str, frozenset] = {}
    on_stack: dict[str, int] = {}
    for root in order:
        if root in first:
            continue
        stack = [(root, iter(_left(shapes[root])))]
        on_stack[root] = 0
        while stack:
            rule, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                del on_stack[rule]
                s = shapes[rule]
                left = _left(s)
                first[rule] = frozenset().union(*(first[r] for r in left)) if left else s.first
            elif nxt in on_stack:
                _cycle([r for r, _ in stack[on_stack[nxt]:]], shapes)
            elif nxt not in first:
                on_stack[nxt] = len(stack)
                stack.append((nxt, iter(_left(shapes[nxt]))))
    return first


def _cycle(loop: list[str], shapes: dict[str, Shape]) -> None:
    refs = [shapes[r].ref for r in loop if shapes[r].target is not None]
    path = " → ".join(refs + refs[:1])
    raise bad(f"$ref cycle {path} cannot be expressed: it recurses before matching any "
              "character")


def _components(shapes: dict[str, Shape], order: list[str]) -> dict[str, int]:
    """Tarjan's strongly connected components, iteratively: rule -> id, where
    rules on one recursion share an id and others get -1."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    comp: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    for root in order:
        if root in index:
            continue
        work = [(root, iter(shapes[root].parts))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            rule, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(shapes[nxt].parts)))
                elif nxt in on:
                    low[rule] = min(low[rule], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[rule])
            if low[rule] == index[rule]:
                members = []
                while True:
                    r = stack.pop()
                    on.discard(r)
                    members.append(r)
                    if r == rule:
                        break
                cyclic = len(members) > 1 or rule in shapes[rule].parts
                for r in members:
                    comp[r] = index[rule] if cyclic else -1
    return comp


def _groups(shape: Shape):
    """The sets of rules that can be live at once: a union's alternatives,
    and the converter's own groups (an object's named and extra keys)."""
    if shape.alts is not None and len(shape.alts) > 1:
        yield shape.what, tuple((f"alternative {i}", a) for i, a in enumerate(shape.alts))
    yield from shape.groups


def _classes(members, leads) -> list[list]:
    """The sets of members whose leads never tell them apart: after the
    text they share, llama.cpp keeps a parse for each of them. A member
    whose lead ends, or an optional space beside a character, ends the
    telling apart (conservatively: the whole group is one class)."""
    out: list[list] = []
    seen: set[tuple[tuple[int, ...], int]] = set()
    todo = [(list(members), 0)]
    while todo and len(seen) < 4_000:
        group, pos = todo.pop()
        key = (tuple(id(m) for m in group), pos)
        if len(group) < 2 or key in seen:
            continue
        seen.add(key)
        if any(len(leads[m[1]]) <= pos for m in group):
            out.append(group)
            todo.append(([m for m in group if len(leads[m[1]]) > pos], pos))
            continue
        spaced = [m for m in group if leads[m[1]][pos] is SP]
        if spaced and len(spaced) < len(group):
            out.append(group)
            todo.append((spaced, pos + 1))
            todo.append(([m for m in group if leads[m[1]][pos] is not SP], pos))
            continue
        if spaced:
            todo.append((group, pos + 1))
            continue
        buckets: dict[str, list] = {}
        for m in group:
            for ch in leads[m[1]][pos]:
                buckets.setdefault(ch, []).append(m)
        todo.extend((b, pos + 1) for b in buckets.values() if len(b) > 1)
    if todo:                                    # too many to tell apart: assume the worst
        out.extend(group for group, _ in todo)
    return out


def _leads(shapes, order, first) -> dict[str, tuple]:
    return {r: shapes[r].lead or (first[r],) for r in order}


def _recursive_ambiguity(shapes, order, first, comp) -> None:
    """Inside a recursion, alternatives that stay alike while one of them
    recurses make llama.cpp's parses multiply (or grow with the depth)."""
    leads = _leads(shapes, order, first)
    for rule in order:
        c = comp[rule]
        if c < 0:
            continue
        for what, members in _groups(shapes[rule]):
            for group in _classes(members, leads):
                inside = [m for m in group if comp[m[1]] == c]
                if not inside:
                    continue        # none recurses: bounded by the schema's depth
                a = inside[0]
                b = next((m for m in inside[1:]), None) or next(m for m in group if m is not a)
                (a, b) = sorted((a, b), key=lambda m: members.index(m))
                shared = sorted(first[a[1]] & first[b[1]]) or ["?"]
                both = (f"alternatives {a[0].split()[-1]} and {b[0].split()[-1]}"
                        if a[0].startswith("alternative") else f"{a[0]} and {b[0]}")
                raise bad(f"{what} is ambiguous inside a recursive $ref ({both} both start "
                          f"with {shared[0]!r}); llama.cpp's grammar would need exponential "
                          "work")


def _live_parses(shapes, order, first) -> None:
    """An upper bound on the parses llama.cpp keeps alive inside each rule:
    alternatives that begin alike add up, a sequence takes its largest
    part, and a recursion's way back counts once (the check above refused
    the recursions that multiply)."""
    leads = _leads(shapes, order, first)
    live: dict[str, int] = {}
    busy: set[str] = set()
    for root in order:
        if root in live:
            continue
        work = [(root, iter(shapes[root].parts))]
        busy.add(root)
        while work:
            rule, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in live and nxt not in busy:
                    busy.add(nxt)
                    work.append((nxt, iter(shapes[nxt].parts)))
                continue
            work.pop()
            busy.discard(rule)
            live[rule] = n = _live_here(shapes[rule], live, leads)
            if n > MAX_LIVE_PARSES:
                what = next((w for w, _ in _groups(shapes[rule])), "the schema")
                raise bad(f"{what} nests ambiguous alternatives so that over "
                          f"{MAX_LIVE_PARSES} parses can be live at once (alternatives that "
                          "begin alike, inside others that do); llama.cpp's grammar would "
                          "need exponential work")


def _live_here(shape: Shape, live: dict[str, int], leads) -> int:
    n = max([shape.live] + [live.get(p, 1) for p in shape.parts])
    for _, members in _groups(shape):
        for group in _classes(members, leads):
            n = max(n, sum(live.get(m, 1) for _, m in group))
    return min(n, MAX_LIVE_PARSES + 1)

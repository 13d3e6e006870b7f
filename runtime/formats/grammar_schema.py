"""The JSON Schema side of grammar.py's converter: the keywords it knows,
the schema size check, and allOf merged into one schema, with $refs inlined
and a $ref that returns to itself refused instead of followed forever
(`{"$defs": {"a": {"$ref": "#/$defs/a"}}, "allOf": [{"$ref": "#/$defs/a"}]}`
would otherwise be expanded forever)."""

from __future__ import annotations

import json
from typing import Any, Callable, overload

from llmctl.runtime.formats.grammar_limits import MAX_DEPTH, MAX_SCHEMA_CHARS, Budget, bad
from llmctl.runtime.formats.grammar_numbers import KEYS as NUMBER_BOUNDS

MAX_REPEAT = 1_000          # llama.cpp refuses repetitions over 2000
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
ANNOTATIONS = {"title", "description", "$schema", "$id", "$comment", "examples", "default",
               "deprecated", "readOnly", "writeOnly"}
KEYWORDS = {"type", "properties", "required", "additionalProperties", "propertyNames",
            "items", "prefixItems",
            "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
            "$defs", "definitions", "minLength", "maxLength", "format", "pattern",
            *NUMBER_BOUNDS} | ANNOTATIONS
_OBJECT_KEYS = {"properties", "required", "additionalProperties", "propertyNames"}
_ARRAY_KEYS = {"items", "prefixItems", "minItems", "maxItems"}
_STRING_KEYS = {"minLength", "maxLength", "format", "pattern"}
_NUMBER_KEYS = set(NUMBER_BOUNDS)
# allOf members that bound the same keyword: the tighter bound holds.
_TIGHTER: dict[str, Callable[[Any, Any], Any]] = {
    "minLength": max, "minItems": max, "minimum": max, "exclusiveMinimum": max,
    "maxLength": min, "maxItems": min, "maximum": min, "exclusiveMaximum": min}


def segment(key: str) -> str:
    """A property name as one segment of a location (JSON Pointer escapes)."""
    return key.replace("~", "~0").replace("/", "~1")


@overload
def count(schema: dict, key: str, default: int) -> int: ...
@overload
def count(schema: dict, key: str, default: None) -> int | None: ...


def count(schema: dict, key: str, default: int | None) -> int | None:
    """The repetition bound `key` of `schema`. Raises InvalidParams unless
    it is an integer in [0, MAX_REPEAT]."""
    value = schema.get(key, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 0 <= value <= MAX_REPEAT):
        raise bad(f"{key} must be an integer in [0, {MAX_REPEAT}], got {str(value)[:60]}")
    return value


def implied_type(schema: dict) -> str | None:
    """The type a schema's keywords imply when it names none."""
    for kind, keys in (("object", _OBJECT_KEYS), ("array", _ARRAY_KEYS), ("string", _STRING_KEYS),
                       ("number", _NUMBER_KEYS)):
        if keys & set(schema):
            return kind
    return None


def merge(base: dict, extra: Any) -> Any:
    """`extra` with the keywords of `base` it does not set itself."""
    if not base or not isinstance(extra, dict):
        return extra
    return {**base, **extra}


def checked(schema: Any) -> dict:
    """`schema` itself. Raises InvalidParams when it is not a JSON object of
    plain JSON within MAX_SCHEMA_CHARS."""
    if not isinstance(schema, dict):
        raise bad(f"the schema must be a JSON object, got {type(schema).__name__}")
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError, RecursionError) as e:
        raise bad(f"the schema is not plain JSON ({str(e)[:100]})") from None
    if size > MAX_SCHEMA_CHARS:
        raise bad(f"the schema is over {MAX_SCHEMA_CHARS:,} characters")
    return schema


def _strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
        raise bad(f"{what} must be a list of strings")
    return value


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class AllOf:
    """allOf as one schema: properties and required united, every other
    keyword the same wherever it appears. `deref` resolves a $ref (raising
    InvalidParams); each member is charged to `budget` as a schema node."""

    def __init__(self, deref: Callable[[Any], dict | bool], budget: Budget):
        self.deref = deref
        self.budget = budget

    def merged(self, schema: dict, where: str, depth: int) -> dict:
        """`schema` with its allOf folded in. Raises InvalidParams for
        members that disagree, a $ref cycle, or too deep a nesting."""
        out = {k: v for k, v in schema.items() if k != "allOf"}
        if isinstance(out.get("properties"), dict):
            out["properties"] = dict(out["properties"])     # ours to extend
        # A dict while merging: uniting lists one member at a time is quadratic.
        out["required"] = dict.fromkeys(_strings(out.get("required", []), f"required at {where}"))
        self.absorb(out, schema["allOf"], where, depth, ())
        out["required"] = list(out["required"])
        if not out["required"]:
            del out["required"]
        return out

    def absorb(self, out: dict, members: Any, where: str, depth: int,
               chain: tuple[str, ...]) -> None:
        if not isinstance(members, list) or not members:
            raise bad(f"allOf at {where} must be a non-empty list")
        if depth > MAX_DEPTH:
            raise bad(f"the schema nests deeper than {MAX_DEPTH} levels (at {where})")
        for member in members:
            self.budget.node(where)
            member, seen = self.resolve(member, chain, where)
            for key, value in member.items():
                if key in ANNOTATIONS or key in ("$defs", "definitions"):
                    continue
                if key == "allOf":
                    self.absorb(out, value, where, depth + 1, seen)
                elif key == "properties" and isinstance(value, dict) \
                        and isinstance(out.setdefault("properties", {}), dict):
                    out["properties"].update(value)
                elif key == "required":
                    out["required"].update(dict.fromkeys(
                        _strings(value, f"required in allOf at {where}")))
                elif key == "pattern":
                    # Every pattern holds: grammar_strings intersects them.
                    held = out.get("pattern", [])
                    out["pattern"] = [*(held if isinstance(held, list) else [held]), value]
                elif key in _TIGHTER and key in out and _numeric(value) and _numeric(out[key]):
                    out[key] = _TIGHTER[key](out[key], value)
                elif key in out and out[key] != value:
                    raise bad(f"allOf members at {where} disagree on {key[:60]!r}")
                else:
                    out[key] = value

    def resolve(self, member: Any, chain: tuple[str, ...], where: str) -> tuple[dict, tuple]:
        """An allOf member with its $refs inlined, and the refs followed to
        get there. Raises InvalidParams for a ref already on `chain`."""
        while isinstance(member, dict) and "$ref" in member:
            ref = member["$ref"]
            if ref in chain:
                loop = " → ".join(chain[chain.index(ref):] + (ref,))
                raise bad(f"$ref cycle {loop} cannot be expressed: it returns to itself "
                          f"before matching any character (allOf at {where})")
            if len(chain) >= MAX_DEPTH:
                raise bad(f"the schema nests deeper than {MAX_DEPTH} levels (at {where})")
            target = self.deref(ref)
            if target is False:
                raise bad(f"{ref} is a false schema, which accepts no value")
            chain += (ref,)
            member = {**(target if isinstance(target, dict) else {}),
                      **{k: v for k, v in member.items() if k != "$ref"}}
        if not isinstance(member, dict):
            raise bad(f"allOf members at {where} must be schemas (objects)")
        return member, chain

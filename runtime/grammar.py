"""GBNF grammars for structured output: any JSON object, JSON matching a
schema, and Hermes-style tool calls. The text goes to SamplingParams.grammar.

The converter is ours rather than llama_cpp.llama_grammar.SchemaConverter:
that port escapes literals wrongly (a `"` or `\\` in a key or enum value
breaks the grammar), lets raw control characters into strings (invalid JSON),
reports errors with `assert`, silently ignores keywords it does not know, and
treats every property of an allOf member as required. Here every output is
valid JSON, and a keyword we cannot enforce is refused by name."""

from __future__ import annotations

import json
import re
from typing import Any

from llmctl.errors import InvalidParams

MAX_SCHEMA_CHARS = 100_000
MAX_DEPTH = 32
MAX_RULES = 2_000
MAX_REPEAT = 1_000          # llama.cpp refuses repetitions over 2000

# Whitespace is at most one space: a model left free to emit newlines and
# indentation can run away in them until max_tokens.
_PRIMITIVES = {
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
_FORMATS = {"date": "date", "time": "time", "date-time": 'date "T" time', "uuid": "uuid"}
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
_ANNOTATIONS = {"title", "description", "$schema", "$id", "$comment", "examples", "default",
                "deprecated", "readOnly", "writeOnly"}
_KEYWORDS = {"type", "properties", "required", "additionalProperties", "items", "prefixItems",
             "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
             "$defs", "definitions", "minLength", "maxLength", "format"} | _ANNOTATIONS
_OBJECT_KEYS = {"properties", "required", "additionalProperties"}
_ARRAY_KEYS = {"items", "prefixItems", "minItems", "maxItems"}
_STRING_KEYS = {"minLength", "maxLength", "format"}


def _where(name: str) -> str:
    return name.strip("-") or "root"


def _bad(message: str) -> InvalidParams:
    return InvalidParams(f"response_format: {message}", param="response_format")


def _literal(value: Any) -> str:
    """A GBNF literal matching `value` written as compact JSON."""
    text = json.dumps(value, ensure_ascii=True, separators=(",", ": "))
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _count(schema: dict, key: str, default: int | None) -> int | None:
    value = schema.get(key, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 0 <= value <= MAX_REPEAT):
        raise _bad(f"{key} must be an integer in [0, {MAX_REPEAT}], got {value!r}")
    return value


def _repeat(item: str, lo: int, hi: int | None) -> str:
    """`item` lo..hi times, comma-separated; '' when hi is 0."""
    if hi == 0:
        return ""
    if lo == 0:
        return f"({_repeat(item, 1, hi)})?"
    rest = "" if hi == 1 else f' ("," space {item}){{{lo - 1},{"" if hi is None else hi - 1}}}'
    return item + rest


class _Converter:
    def __init__(self, root: dict):
        self.root = root
        self.rules: dict[str, str] = {"space": _PRIMITIVES["space"]}
        self.refs: dict[str, str] = {}

    def grammar(self) -> str:
        return "\n".join(f"{name} ::= {body}" for name, body in self.rules.items())

    def add(self, name: str, body: str) -> str:
        name = re.sub(r"[^a-zA-Z0-9-]+", "-", name).strip("-") or "r"
        key, i = name, 1
        while key in self.rules or key in _PRIMITIVES:
            key, i = f"{name}-{i}", i + 1
        if len(self.rules) >= MAX_RULES:
            raise _bad(f"the schema needs over {MAX_RULES} grammar rules")
        self.rules[key] = body
        return key

    def primitive(self, name: str) -> str:
        if name not in self.rules:
            self.rules[name] = _PRIMITIVES[name]
            for dep in _DEPS.get(name, []):
                self.primitive(dep)
        return name

    def deref(self, ref: Any) -> dict | bool:
        m = re.fullmatch(r"#/(\$defs|definitions)/([^/]+)", ref) if isinstance(ref, str) else None
        defs = self.root.get(m.group(1)) if m else None
        target = defs.get(m.group(2)) if isinstance(defs, dict) else None
        if not isinstance(target, (dict, bool)):
            raise _bad(f"$ref {ref!r} must point into #/$defs or #/definitions")
        return target

    def visit(self, schema: Any, name: str, depth: int = 0) -> str:
        """The rule name for values that `schema` accepts."""
        if depth > MAX_DEPTH:
            raise _bad(f"the schema nests deeper than {MAX_DEPTH} levels")
        if schema is True or schema == {}:
            return self.primitive("value")
        if not isinstance(schema, dict):
            raise _bad(f"a schema must be an object, got {json.dumps(schema)[:60]}"
                       if schema is not False else "a false schema accepts no value")
        unknown = sorted(set(schema) - _KEYWORDS)
        if unknown:
            raise _bad(f"unsupported JSON Schema keyword(s) {', '.join(unknown)} at {_where(name)}")
        if "$ref" in schema:
            return self.visit_ref(schema, name, depth)
        if "allOf" in schema:
            return self.visit(_merge_all_of(self, schema), name, depth + 1)
        alts = schema.get("anyOf", schema.get("oneOf"))
        if alts is not None:
            if not isinstance(alts, list) or not alts:
                raise _bad(f"anyOf/oneOf at {_where(name)} must be a non-empty list")
            rest = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}
            return self.add(name or "root", " | ".join(
                self.visit(_merge(rest, a), f"{name}-{i}", depth + 1) for i, a in enumerate(alts)))
        if "const" in schema:
            return self.add(name or "root", _literal(schema["const"]) + " space")
        if "enum" in schema:
            if not isinstance(schema["enum"], list) or not schema["enum"]:
                raise _bad(f"enum at {_where(name)} must be a non-empty list")
            body = " | ".join(_literal(v) for v in schema["enum"])
            return self.add(name or "root", f"({body}) space")
        types = schema.get("type", _implied_type(schema))
        if isinstance(types, list):
            if not types:
                raise _bad(f"type at {_where(name)} is an empty list")
            return self.add(name or "root", " | ".join(
                self.visit({**schema, "type": t}, f"{name}-{t}", depth + 1) for t in types))
        return self.visit_type(schema, types, name, depth)

    def visit_ref(self, schema: dict, name: str, depth: int) -> str:
        ref = schema["$ref"]
        extra = sorted(set(schema) - _ANNOTATIONS - {"$ref", "$defs", "definitions"})
        if extra:
            raise _bad(f"$ref cannot be combined with {', '.join(extra)} (use allOf)")
        if ref not in self.refs:
            # Named before visiting, so a recursive definition refers to itself.
            rule = self.refs[ref] = self.add("ref-" + ref.rsplit("/", 1)[-1], "")
            self.rules[rule] = self.visit(self.deref(ref), rule + "-body", depth + 1)
        return self.refs[ref]

    def visit_type(self, schema: dict, kind: Any, name: str, depth: int) -> str:
        if kind is None:
            return self.primitive("value")
        if kind not in _TYPES:
            raise _bad(f"unknown type {kind!r} at {_where(name)}")
        if kind == "object":
            return self.visit_object(schema, name, depth)
        if kind == "array":
            return self.visit_array(schema, name, depth)
        if kind == "string":
            return self.visit_string(schema, name)
        return self.primitive(kind)

    def visit_object(self, schema: dict, name: str, depth: int) -> str:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        extra = schema.get("additionalProperties", not props)
        if not isinstance(props, dict) or not isinstance(required, list) \
                or not all(isinstance(r, str) for r in required):
            raise _bad(f"properties/required at {_where(name)} are malformed")
        if not props and not required and extra is True:
            return self.primitive("object")
        kv = {}
        for key in list(props) + [r for r in required if r not in props]:
            sub = props.get(key, extra if extra is not False else None)
            if sub is None:
                raise _bad(f"required property {key!r} is not allowed by additionalProperties")
            value = self.visit(sub, f"{name}-{key}", depth + 1)
            kv[key] = self.add(f"{name}-{key}-kv", f'{_literal(key)} space ":" space {value}')
        req = [kv[k] for k in kv if k in required]
        opt = [kv[k] for k in kv if k not in required]
        if extra is not False:
            value = self.visit(extra, f"{name}-extra", depth + 1)
            one = self.add(f"{name}-extra-kv", f'{self.primitive("string")} ":" space {value}')
            opt.append(self.add(f"{name}-extra-kvs", f'{one} ("," space {one})*'))
        body = ' "," space '.join(req) or None
        if opt:
            # tails[i]: the optional properties from i on, each with its comma.
            tails = [""] * (len(opt) + 1)
            for i in range(len(opt) - 1, -1 if req else 0, -1):
                tails[i] = self.add(f"{name}-opt", f'("," space {opt[i]})? {tails[i + 1]}'.strip())
            if req:
                body += f" {tails[0]}"
            else:
                body = "(" + " | ".join(f"{o} {tails[i + 1]}".strip()
                                        for i, o in enumerate(opt)) + ")?"
        return self.add(name or "root", " ".join(filter(None, ['"{" space', body, '"}" space'])))

    def visit_array(self, schema: dict, name: str, depth: int) -> str:
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", None)
        if isinstance(items, list):     # draft-07 tuples
            prefix, items = items, schema.get("additionalItems", None)
        if not isinstance(prefix, list):
            raise _bad(f"prefixItems at {_where(name)} must be a list")
        lo, hi = _count(schema, "minItems", 0), _count(schema, "maxItems", None)
        if hi is not None and hi < lo:
            raise _bad(f"maxItems < minItems at {_where(name)}")
        n_pre = len(prefix) if hi is None else min(len(prefix), hi)
        parts = [self.visit(p, f"{name}-{i}", depth + 1) for i, p in enumerate(prefix[:n_pre])]
        more_lo = max(0, lo - n_pre)
        more_hi = None if hi is None else hi - n_pre
        if items is False or (items is None and prefix):
            if items is False and more_lo:
                raise _bad(f"minItems at {_where(name)} needs more items than allowed")
            more_hi = more_lo       # only what minItems demands
        more = ""
        if more_hi != 0:
            item = self.visit(True if items is None else items, f"{name}-item", depth + 1)
            more = (f'("," space {item}){{{more_lo},{"" if more_hi is None else more_hi}}}'
                    if parts else _repeat(item, more_lo, more_hi))
        items_rule = ' "," space '.join(parts)
        return self.add(name or "root", " ".join(
            filter(None, ['"[" space', items_rule, more, '"]" space'])))

    def visit_string(self, schema: dict, name: str) -> str:
        fmt = schema.get("format")
        if fmt in _FORMATS:
            for dep in ("date", "time", "uuid"):
                if dep in _FORMATS[fmt]:
                    self.primitive(dep)
            return self.add(name or "root", rf'"\"" {_FORMATS[fmt]} "\"" space')
        lo, hi = _count(schema, "minLength", 0), _count(schema, "maxLength", None)
        if lo == 0 and hi is None:
            return self.primitive("string")
        if hi is not None and hi < lo:
            raise _bad(f"maxLength < minLength at {_where(name)}")
        self.primitive("char")
        return self.add(name or "root", rf'"\"" char{{{lo},{"" if hi is None else hi}}} "\"" space')


def _implied_type(schema: dict) -> str | None:
    for kind, keys in (("object", _OBJECT_KEYS), ("array", _ARRAY_KEYS), ("string", _STRING_KEYS)):
        if keys & set(schema):
            return kind
    return None


def _merge(base: dict, extra: Any) -> Any:
    """`extra` with the keywords of `base` it does not set itself."""
    if not base or not isinstance(extra, dict):
        return extra
    return {**base, **extra}


def _merge_all_of(conv: _Converter, schema: dict) -> dict:
    """allOf as one schema: properties and required united, every other
    keyword the same wherever it appears."""
    members = schema["allOf"]
    if not isinstance(members, list) or not members:
        raise _bad("allOf must be a non-empty list")
    merged = {k: v for k, v in schema.items() if k != "allOf"}
    for member in members:
        while isinstance(member, dict) and "$ref" in member:
            member = {**conv.deref(member["$ref"]),
                      **{k: v for k, v in member.items() if k != "$ref"}}
        if not isinstance(member, dict):
            raise _bad("allOf members must be schemas (objects)")
        for key, value in member.items():
            if key in _ANNOTATIONS:
                continue
            if key == "properties" and isinstance(value, dict):
                merged["properties"] = {**merged.get("properties", {}), **value}
            elif key == "required" and isinstance(value, list):
                merged["required"] = list(dict.fromkeys(merged.get("required", []) + value))
            elif key in merged and merged[key] != value:
                raise _bad(f"allOf members disagree on {key!r}")
            else:
                merged[key] = value
    return merged


def _checked(schema: Any) -> dict:
    if not isinstance(schema, dict):
        raise _bad(f"the schema must be a JSON object, got {type(schema).__name__}")
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError, RecursionError) as e:
        raise _bad(f"the schema is not plain JSON ({e})") from None
    if size > MAX_SCHEMA_CHARS:
        raise _bad(f"the schema is over {MAX_SCHEMA_CHARS:,} characters")
    return schema


def json_object_grammar() -> str:
    """GBNF for any JSON object."""
    conv = _Converter({})
    conv.rules["root"] = conv.primitive("object")
    return conv.grammar()


def json_schema_grammar(schema: dict) -> str:
    """GBNF for JSON values that `schema` accepts. Raises InvalidParams
    (param "response_format") naming any keyword it cannot enforce, and for
    a schema that is not a JSON object, too big, too deep, or has a $ref
    outside #/$defs or #/definitions."""
    conv = _Converter(_checked(schema))
    top = conv.visit(schema, "")
    if top != "root":
        conv.rules["root"] = top
    return conv.grammar()


def tool_call_grammar(tools: list[dict], style: str = "hermes", *, parallel: bool = False) -> str:
    """GBNF for Hermes-style tool calls: `<tool_call>\n{"name": N,
    "arguments": A}\n</tool_call>`, N one of the tools' names and A matching
    that tool's parameter schema; several calls, one per line, when
    `parallel`. `tools` are OpenAI tool objects ({"type": "function",
    "function": {"name", "parameters"}}) or their bare "function" parts.
    For tool_choice "auto" pass grammar_triggers=("<tool_call>",) with it, so
    the model may answer in free text instead. Raises InvalidParams (param
    "tools") for an unknown style, a malformed tool or an unsupported schema."""
    if style != "hermes":
        raise InvalidParams(f"unsupported tool-call style {style!r} (known: hermes)", param="tools")
    if not isinstance(tools, list) or not tools:
        raise InvalidParams("tools must be a non-empty list", param="tools")
    conv = _Converter({})
    calls = []
    for i, tool in enumerate(tools):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise InvalidParams(f"tools[{i}] has no function name", param="tools")
        params = fn.get("parameters") or {"type": "object"}
        try:
            conv.root, conv.refs = _checked(params), {}     # each tool's own $defs
            args = conv.visit(params, f"tool{i}-args")
        except InvalidParams as e:
            raise InvalidParams(f"tools[{i}] ({name}) parameters: "
                                + e.message.removeprefix("response_format: "), param="tools") from None
        calls.append(conv.add(f"tool{i}", " ".join([
            '"{" space', _literal("name"), 'space ":" space', _literal(name), 'space "," space',
            _literal("arguments"), 'space ":" space', args, '"}" space'])))
    call = conv.add("call", r'"<tool_call>\n" (' + " | ".join(calls) + r') "\n</tool_call>"')
    conv.rules["root"] = f'{call} ("\\n" {call})*' if parallel else call
    return conv.grammar()

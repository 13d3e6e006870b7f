"""GBNF grammars for structured output: any JSON object, JSON matching a
schema, and Hermes-style tool calls. The text goes to SamplingParams.grammar.

The converter is ours rather than llama_cpp.llama_grammar.SchemaConverter:
that port escapes literals wrongly (a `"` or `\\` in a key or enum value
breaks the grammar), lets raw control characters into strings (invalid JSON),
reports errors with `assert`, silently ignores keywords it does not know, and
treats every property of an allOf member as required. Here every output is
valid JSON, and a keyword we cannot enforce is refused by name.

Every conversion is bounded (grammar_limits.py): its work is counted while it
walks, and the finished rules are checked for $ref cycles and for ambiguity
that would make llama.cpp's grammar engine work exponentially. The functions
are pure, so a server may run them in a worker thread."""

from __future__ import annotations

import json
import re
from typing import Any

from llmctl.errors import InvalidParams
from llmctl.runtime.formats import grammar_limits as gl
from llmctl.runtime.formats import grammar_numbers as gn
from llmctl.runtime.formats import grammar_schema as gs
from llmctl.runtime.formats import grammar_strings as gstr
from llmctl.runtime.formats.grammar_limits import bad as _bad
from llmctl.runtime.formats.grammar_rules import Rules, json_text, literal, repeat


class _Converter(Rules):
    """One conversion of a schema to rules: the schema whose $defs refs
    point into, the rules made for each ref and each enum seen."""

    def __init__(self, root: dict, prefix: str = ""):
        super().__init__(prefix)
        self.root = root
        self.refs: dict[str, str] = {}
        self.literals: dict[int, tuple[Any, str]] = {}  # id(enum list or const) -> it, its rule

    def deref(self, ref: Any) -> dict | bool:
        m = re.fullmatch(r"#/(\$defs|definitions)/([^/]+)", ref) if isinstance(ref, str) else None
        defs = self.root.get(m.group(1)) if m else None
        target = defs.get(m.group(2)) if m and isinstance(defs, dict) else None
        if not isinstance(target, (dict, bool)):
            raise _bad(f"$ref {str(ref)[:200]!r} must point into #/$defs or #/definitions")
        return target

    def visit(self, schema: Any, at: str, depth: int = 0) -> str:
        """The rule name for values that `schema` (found at location `at`)
        accepts. Raises InvalidParams."""
        where = at.lstrip("/") or "root"
        if depth > gl.MAX_DEPTH:
            raise _bad(f"the schema nests deeper than {gl.MAX_DEPTH} levels (at {where})")
        self.budget.node(where)
        if schema is True or schema == {}:
            return self.primitive("value")
        if not isinstance(schema, dict):
            raise _bad(f"a schema must be an object, got {json.dumps(schema)[:60]}"
                       if schema is not False else "a false schema accepts no value")
        unknown = sorted(set(schema) - gs.KEYWORDS)
        if unknown:
            raise _bad(f"unsupported JSON Schema keyword(s) {', '.join(unknown)[:200]} "
                       f"at {where}")
        if "$ref" in schema:
            return self.visit_ref(schema, at, depth)
        if "allOf" in schema:
            merged = gs.AllOf(self.deref, self.budget).merged(schema, where, depth)
            return self.visit(merged, at, depth + 1)
        if "anyOf" in schema or "oneOf" in schema:
            return self.visit_union(schema, at, depth)
        if "const" in schema or "enum" in schema:
            return self.visit_literals(schema, at)
        types = schema.get("type", gs.implied_type(schema))
        if isinstance(types, list):
            return self.visit_types(schema, types, at, depth)
        return self.visit_type(schema, types, at, depth)

    def visit_union(self, schema: dict, at: str, depth: int) -> str:
        where = at.lstrip("/") or "root"
        if "anyOf" in schema and "oneOf" in schema:
            raise _bad(f"anyOf and oneOf together at {where} are not supported")
        key = "anyOf" if "anyOf" in schema else "oneOf"
        alts = schema[key]
        if not isinstance(alts, list) or not alts:
            raise _bad(f"anyOf/oneOf at {where} must be a non-empty list")
        self.budget.alternatives(len(alts), where)
        rest = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}
        names = [self.visit(gs.merge(rest, a), f"{at}/{key}/{i}", depth + 1)
                 for i, a in enumerate(alts)]
        return self.add(self.name(at), " | ".join(names),
                        gl.Shape(alts=tuple(names), what=f"{key} at {where}"))

    def visit_literals(self, schema: dict, at: str) -> str:
        where = at.lstrip("/") or "root"
        if "const" in schema:
            held, values = schema["const"], [schema["const"]]
        else:
            held = values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise _bad(f"enum at {where} must be a non-empty list")
        # anyOf and type lists copy the keywords beside them into each
        # alternative: the same enum is then built once, not once for each.
        hit = self.literals.get(id(held))
        if hit is not None:
            return hit[1]
        self.budget.enum(len(values), where)
        texts = list(dict.fromkeys(json_text(v) for v in values))
        lits = ['"' + t.replace("\\", "\\\\").replace('"', '\\"') + '"' for t in texts]
        body = f"({' | '.join(lits)}) space" if len(lits) > 1 else f"{lits[0]} space"
        shape = gl.Shape(first=frozenset(t[0] for t in texts), lead=gl.text_lead(texts), live=len(lits))
        rule = self.add(self.name(at), body, shape)
        self.literals[id(held)] = (held, rule)
        return rule

    def visit_types(self, schema: dict, types: list, at: str, depth: int) -> str:
        where = at.lstrip("/") or "root"
        if not types or len(types) > len(gs.TYPES) \
                or len(set(map(str, types))) != len(types):
            raise _bad(f"type at {where} must be a non-empty list of distinct types")
        names = [self.visit({**schema, "type": t}, f"{at}/type/{t}", depth + 1) for t in types]
        return self.add(self.name(at), " | ".join(names),
                        gl.Shape(alts=tuple(names), what=f"type list at {where}"))

    def visit_ref(self, schema: dict, at: str, depth: int) -> str:
        ref = schema["$ref"]
        extra = sorted(set(schema) - gs.ANNOTATIONS - {"$ref", "$defs", "definitions"})
        if extra:
            raise _bad(f"$ref cannot be combined with {', '.join(extra)} (use allOf)")
        if ref not in self.refs:
            target = self.deref(ref)
            # Named before visiting, so a recursive definition refers to itself.
            rule = self.refs[ref] = self.add("ref-" + ref.rsplit("/", 1)[-1], "")
            body = self.visit(target, ref.removeprefix("#/"), depth + 1)
            self.rules[rule] = body
            self.shapes[rule] = gl.Shape(target=body, ref=ref, parts=(body,))
        return self.refs[ref]

    def visit_type(self, schema: dict, kind: Any, at: str, depth: int) -> str:
        if kind is None:
            return self.primitive("value")
        if kind not in gs.TYPES:
            raise _bad(f"unknown type {str(kind)[:60]!r} at {at.lstrip('/') or 'root'}")
        if kind == "object":
            return self.visit_object(schema, at, depth)
        if kind == "array":
            return self.visit_array(schema, at, depth)
        if kind == "string":
            return gstr.string_rule(self, schema, at)
        if kind in ("integer", "number"):
            return self.visit_bounded(schema, kind, at)
        return self.primitive(kind)

    def visit_bounded(self, schema: dict, kind: str, at: str) -> str:
        where = at.lstrip("/") or "root"
        bounds = gn.bounds(schema, kind, where)
        if bounds is None:
            return self.primitive(kind)
        body, live = (gn.integer_body if kind == "integer" else gn.number_body)(bounds)
        return self.add(self.name(at), body, gl.Shape(first=gl.DIGITS, live=live))

    def visit_object(self, schema: dict, at: str, depth: int) -> str:
        where = at.lstrip("/") or "root"
        props = schema.get("properties", {})
        required = schema.get("required", [])
        extra = schema.get("additionalProperties", not props)
        names = schema.get("propertyNames", True)
        if not isinstance(props, dict) or not isinstance(required, list) \
                or not all(isinstance(r, str) for r in required):
            raise _bad(f"properties/required at {where} are malformed")
        if names is False:          # no name is valid: only the empty object
            if required:
                raise _bad(f"required properties at {where} cannot meet propertyNames: false")
            return self.add(self.name(at), '"{" space "}"', gl.Shape(first=frozenset("{")))
        if not props and not required and extra is True and names is True:
            return self.primitive("object")
        self.budget.props(len(props) + len(required), where)
        needed = set(required)
        kv, values = {}, {}
        for key in list(props) + [r for r in dict.fromkeys(required) if r not in props]:
            sub = props.get(key, extra if extra is not False else None)
            if sub is None:
                raise _bad(f"required property {key[:100]!r} is not allowed by "
                           "additionalProperties")
            values[key] = self.visit(sub, f"{at}/properties/{gs.segment(key)}", depth + 1)
            kv[key] = self.add(self.name(at, f"{key}-kv"),
                               f'{literal(key)} space ":" space {values[key]}')
        req = [kv[k] for k in kv if k in needed]
        opt = [kv[k] for k in kv if k not in needed]
        groups: tuple = ()
        if extra is not False:
            value = self.visit(extra, f"{at}/additionalProperties", depth + 1)
            one = self.add(self.name(at, "extra-kv"),
                           f'{self.key_rule(names, at, depth)} ":" space {value}')
            opt.append(self.add(self.name(at, "extra-kvs"), f'{one} ("," space {one})*'))
            # Where an optional named key may come, so may an extra key, and
            # the name matches the extra keys' string too: both stay live.
            groups = tuple((f"additionalProperties at {where}",
                            ((f"property {k[:60]!r}", v), ("additionalProperties", value)))
                           for k, v in values.items() if k not in needed)
        lead: tuple = (frozenset("{"),)
        if req:     # what tells this object from others: its first key (and value)
            first_key = next(k for k in kv if k in needed)
            lead += (gl.SP, *gl.text_lead([json_text(first_key)]), gl.SP, frozenset(":"), gl.SP,
                     *self.shapes[values[first_key]].lead)
        return self.add(self.name(at), self.object_body(at, req, opt),
                        gl.Shape(first=frozenset("{"), groups=groups, lead=lead[:gl.MAX_LEAD]))

    def key_rule(self, names: Any, at: str, depth: int) -> str:
        """The rule for an extra key: any string, or propertyNames' (a
        string schema: its length bounds, pattern, enum or const)."""
        if names is True:
            return self.primitive("string")
        where = f"{at.lstrip('/') or 'root'}/propertyNames"
        if not isinstance(names, dict) or names.get("type", "string") != "string":
            raise _bad(f"propertyNames at {where} must be a string schema")
        return self.visit({**names, "type": "string"}, f"{at}/propertyNames", depth + 1)

    def object_body(self, at: str, req: list[str], opt: list[str]) -> str:
        body = ' "," space '.join(req)
        if opt:
            # tails[i]: the optional properties from i on, each with its comma.
            tails = [""] * (len(opt) + 1)
            for i in range(len(opt) - 1, -1 if req else 0, -1):
                tails[i] = self.add(self.name(at, "opt"),
                                    f'("," space {opt[i]})? {tails[i + 1]}'.strip())
            if req:
                body += f" {tails[0]}"
            else:
                body = "(" + " | ".join(f"{o} {tails[i + 1]}".strip()
                                        for i, o in enumerate(opt)) + ")?"
        return " ".join(filter(None, ['"{" space', body, '"}" space']))

    def visit_array(self, schema: dict, at: str, depth: int) -> str:
        where = at.lstrip("/") or "root"
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", None)
        if isinstance(items, list):     # draft-07 tuples
            prefix, items = items, schema.get("additionalItems", None)
        if not isinstance(prefix, list):
            raise _bad(f"prefixItems at {where} must be a list")
        lo, hi = gs.count(schema, "minItems", 0), gs.count(schema, "maxItems", None)
        if hi is not None and hi < lo:
            raise _bad(f"maxItems < minItems at {where}")
        self.budget.repeat(max(lo, hi or 0))
        n_pre = len(prefix) if hi is None else min(len(prefix), hi)
        parts = [self.visit(p, f"{at}/prefixItems/{i}", depth + 1)
                 for i, p in enumerate(prefix[:n_pre])]
        more_lo = max(0, lo - n_pre)
        more_hi = None if hi is None else hi - n_pre
        if items is False or (items is None and prefix):
            if items is False and more_lo:
                raise _bad(f"minItems at {where} needs more items than allowed")
            more_hi = more_lo       # only what minItems demands
        more = ""
        if more_hi != 0:
            item = self.visit(True if items is None else items, f"{at}/items", depth + 1)
            more = (f'("," space {item}){{{more_lo},{"" if more_hi is None else more_hi}}}'
                    if parts else repeat(item, more_lo, more_hi))
        items_rule = ' "," space '.join(parts)
        lead = (frozenset("["),)
        head = parts[0] if parts else item if more_lo else None
        if head is not None:    # an item must come: it tells this array from others
            lead = (*lead, gl.SP, *self.shapes[head].lead)[:gl.MAX_LEAD]
        return self.add(self.name(at), " ".join(
            filter(None, ['"[" space', items_rule, more, '"]" space'])),
            gl.Shape(first=frozenset("["), lead=lead))


def json_object_grammar() -> str:
    """GBNF for any JSON object."""
    conv = _Converter({})
    conv.rules["root"] = conv.primitive("object")
    return conv.grammar()


def json_schema_grammar(schema: dict) -> str:
    """GBNF for JSON values that `schema` accepts. Raises InvalidParams
    (param "response_format") naming any keyword it cannot enforce, and for
    a schema that is not a JSON object, too big, too deep, too costly to
    convert or to run (grammar_limits.py), has a $ref outside #/$defs or
    #/definitions, or a $ref cycle that matches nothing before recursing."""
    conv = _Converter(gs.checked(schema))
    top = conv.visit(schema, "")
    gl.check_rules(conv.shapes, top)
    conv.rules["root"] = top
    return conv.grammar()


def tool_call_grammar(tools: list[dict], style: str = "hermes", *, parallel: bool = False,
                      openings: bool = False) -> str:
    """GBNF for Hermes-style tool calls: `<tool_call>\n{"name": N,
    "arguments": A}\n</tool_call>`, N one of the tools' names and A matching
    that tool's parameter schema; several calls, one per line, when
    `parallel`. `tools` are OpenAI tool objects ({"type": "function",
    "function": {"name", "parameters"}}) or their bare "function" parts.
    For tool_choice "auto" pass grammar_triggers=("<tool_call>",) with it, so
    the model may answer in free text instead. `openings` also admits one
    call object without the tag, bare or in a ```/```json fence (see
    tool_shapes.CALL_OPENING, the trigger that starts it), and any text
    after it: the parser reads such a call only as the whole answer. Raises
    InvalidParams (param "tools") for an unknown style, a malformed tool or
    an unsupported or too costly schema (as json_schema_grammar)."""
    if style != "hermes":
        raise InvalidParams(f"unsupported tool-call style {style!r} (known: hermes)", param="tools")
    if not isinstance(tools, list) or not tools:
        raise InvalidParams("tools must be a non-empty list", param="tools")
    conv = _Converter({})
    heads = [(literal(name), args) for name, args in _tool_arguments(conv, tools)]
    tail = ['space "," space', literal("arguments"), 'space ":" space']
    calls = [conv.add(f"tool{i}", " ".join(['"{" space', literal("name"), 'space ":" space',
                                            name, *tail, args, '"}" space']))
             for i, (name, args) in enumerate(heads)]
    call = conv.add("call", r'"<tool_call>\n" (' + " | ".join(calls) + r') "\n</tool_call>"')
    root = f'{call} ("\\n" {call})*' if parallel else call
    if openings:
        # The head up to the name may hold what the trigger already let
        # through (tool_shapes.CALL_OPENING): newlines and indentation.
        ws = conv.add("head-ws", r"[ \t\r\n]{0,8}")
        bare = conv.add("bare", " | ".join(
            conv.add(f"bare{i}", " ".join(['"{"', ws, literal("name"), ws, '":"', ws,
                                           name, *tail, args, '"}" space']))
            for i, (name, args) in enumerate(heads)))
        fenced = conv.add("fenced", rf'"```" [ \t]{{0,4}} "json"? [ \t]{{0,4}} "\r"? "\n" {ws} '
                                    rf'{bare} "\n```"')
        # One untagged call, then free text: it is a call only as the whole
        # answer (tool_calls.py), so the model may stop after it, as it does
        # for a first call, or go on: a small model echoes its last call
        # after a tool's result and then answers, and a grammar that ended
        # there (or read "\n{" as a second call) would cut that answer off.
        free = conv.add("free-text", "[^\\x00]*")
        root = f"({root}) | {bare} {free} | {fenced} {free}"
    conv.rules["root"] = root
    return conv.grammar()


def _tool_arguments(conv: _Converter, tools: list[dict]) -> list[tuple[str, str]]:
    """(name, the rule for its arguments) of each tool. Raises InvalidParams
    (param "tools") naming the tool that is malformed or whose schema fails."""
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise InvalidParams(f"tools[{i}] has no function name", param="tools")
        params = fn.get("parameters") or {"type": "object"}
        try:
            # Each tool has its own $defs; the content limits are per schema,
            # the work budget is the request's.
            conv.root, conv.refs, conv.prefix = gs.checked(params), {}, f"tool{i}-args"
            conv.budget.properties = conv.budget.enum_values = 0
            args = conv.visit(params, "")
            gl.check_rules(conv.shapes, args)
            conv.prefix = ""
        except InvalidParams as e:
            raise InvalidParams(f"tools[{i}] ({name[:100]}) parameters: "
                                + e.message.removeprefix("response_format: "), param="tools") from None
        out.append((name, args))
    return out

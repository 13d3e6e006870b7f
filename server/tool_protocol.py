"""The structured-output fields of a request: `tools`, `tool_choice`,
`parallel_tool_calls`, `response_format` and `logit_bias`. Each is validated
here (a 400 naming it when wrong) and turned into what the runtime needs: a
grammar for the sampler and a ToolSetup for reading the answer."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from llmctl.errors import InvalidParams
from llmctl.runtime.formats.grammar import json_object_grammar, json_schema_grammar, tool_call_grammar
from llmctl.runtime.formats.tool_calls import ToolFormat
from llmctl.runtime.formats.tool_schema import ToolChoice, validate_tool_choice, validate_tools
from llmctl.runtime.formats.tool_shapes import CALL_OPENING
from llmctl.runtime.sampling import SamplingParams, parse_logit_bias
from llmctl.server.answer_reader import ToolSetup

# llama-server's --reasoning-format values that llmctl implements.
REASONING_FORMATS = ("auto", "deepseek", "none")
# The text a Hermes-style model writes to open a call: a lazy grammar starts
# there. Small ones often drop the tag and answer with the call object alone,
# bare or fenced: CALL_OPENING starts the same grammar at the answer's start.
_TRIGGERS = {ToolFormat.HERMES: ("<tool_call>", CALL_OPENING)}


@dataclass(frozen=True)
class Structured:
    """What a request asks of the answer's shape."""

    tools: list[dict] | None = None
    choice: ToolChoice = ToolChoice("none")
    parallel: bool = True
    grammar: str | None = None          # from response_format
    logit_bias: tuple[tuple[int, float], ...] = ()
    reasoning_format: str | None = None     # None: the server's

    def sampling(self, params: SamplingParams, fmt: ToolFormat) -> SamplingParams:
        """`params` with the grammar and biases this request needs. Raises
        InvalidParams when the model's tool format can't be constrained."""
        grammar = self.grammar
        triggers: tuple[str, ...] = ()
        if self.tools and self.choice.mode != "none":
            names = self.choice.allowed({t["function"]["name"] for t in self.tools})
            chosen = [t for t in self.tools if t["function"]["name"] in names]
            forced = self.choice.mode in ("required", "function")
            if fmt is ToolFormat.HERMES:
                grammar = tool_call_grammar(chosen, "hermes", parallel=self.parallel,
                                            openings=not forced)
                triggers = () if forced else _TRIGGERS[fmt]
            elif forced:
                raise InvalidParams(f"tool_choice {self.choice.mode!r} needs a model whose "
                                    f"template writes <tool_call> blocks; this one uses "
                                    f"{fmt.value!r}", param="tool_choice")
        return replace(params, grammar=grammar, grammar_triggers=triggers,
                       logit_bias=self.logit_bias or params.logit_bias)

    def setup(self, fmt: ToolFormat, reasoning: str, *, thinks: bool = False,
              started_in_thought: bool = False) -> ToolSetup | None:
        """How to read the answer; None when it is plain text. `reasoning`
        is the server's --reasoning-format unless the request named one:
        "deepseek" splits a leading <think> block into reasoning_content,
        "none" leaves it in the content, and "auto" splits it for models
        that think (`thinks`: the template knows <think>; or the prompt
        already opened the thought)."""
        reasoning = self.reasoning_format or reasoning
        split = reasoning == "deepseek" or (reasoning == "auto"
                                            and (thinks or started_in_thought))
        if not self.tools and not split:
            return None
        names = self.choice.allowed({t["function"]["name"] for t in self.tools or []})
        # sampling() gives exactly these answers the tool-call grammar.
        grammar = bool(self.tools) and self.choice.mode != "none" and fmt is ToolFormat.HERMES
        return ToolSetup(fmt, frozenset(names), self.parallel, reasoning=split,
                         started_in_thought=split and started_in_thought, constrained=grammar)


def parse_structured(body: dict, chat: bool) -> Structured:
    """Validate the structured-output fields. Raises InvalidParams naming
    the field; tools on /v1/completions are refused (no template)."""
    tools_given = body.get("tools") not in (None, [])
    if tools_given and not chat:
        raise InvalidParams("'tools' needs /v1/chat/completions", param="tools")
    tools = validate_tools(body.get("tools")) if chat else []
    choice = validate_tool_choice(body.get("tool_choice"), tools)
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise InvalidParams("'parallel_tool_calls' must be a boolean", param="parallel_tool_calls")
    grammar = _response_format(body.get("response_format"))
    if grammar is not None and tools and choice.mode != "none":
        raise InvalidParams("'response_format' cannot be combined with tools unless "
                            "tool_choice is 'none'", param="response_format")
    return Structured(tools or None, choice, parallel, grammar, _logit_bias(body.get("logit_bias")),
                      parse_reasoning_format(body.get("reasoning_format")))


def parse_reasoning_format(value: Any) -> str | None:
    """A request's `reasoning_format` (llama-server's field): None, or one
    of REASONING_FORMATS. Raises InvalidParams naming it."""
    if value is None or value in REASONING_FORMATS:
        return value
    raise InvalidParams(f"'reasoning_format' must be one of {', '.join(REASONING_FORMATS)}",
                        param="reasoning_format")


def _response_format(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise InvalidParams("'response_format' must be an object with a 'type'",
                            param="response_format")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return json_object_grammar()
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise InvalidParams("'response_format.json_schema' must be an object with a "
                                "'name' and a 'schema'", param="response_format")
        schema = spec.get("schema", {})
        if spec.get("strict") not in (None, True, False):
            raise InvalidParams("'response_format.json_schema.strict' must be a boolean",
                                param="response_format")
        return json_schema_grammar(schema)
    raise InvalidParams(f"'response_format.type' {kind[:32]!r} is not one of text, json_object, "
                        "json_schema", param="response_format")


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias} map, parsed as SamplingParams parses it
    (ASCII decimal ids up to 2**31 - 1, biases from -100 to 100); ids are
    checked against the vocabulary when the sampler is built. Raises
    InvalidParams naming logit_bias."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InvalidParams("'logit_bias' must be an object mapping token ids to biases",
                            param="logit_bias")
    return parse_logit_bias(value)

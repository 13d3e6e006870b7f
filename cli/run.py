"""`llmctl run MODEL PROMPT`: a one-shot answer on stdout."""

from __future__ import annotations

import sys

import typer
from typing_extensions import Annotated

from llmctl.cli import options as o
from llmctl.cli.common import err, handle_errors, note_base_model, print_json, write_out
from llmctl.cli.mcp import MaxStepsOpt, McpOpt, YesOpt
from llmctl.errors import UsageError


def read_prompt(prompt: str) -> str:
    """The prompt argument, or all of stdin for `-`."""
    return sys.stdin.read() if prompt == "-" else prompt


def prompt_only(model: str | None, prompt: str) -> tuple[str | None, str]:
    """(model, prompt) with a lone argument read as the prompt when it has
    whitespace, which no model name or path given here has: `llmctl run
    "Why is the sky blue?"` asks the default model. Raises nothing."""
    if prompt == "-" and model is not None and any(c.isspace() for c in model):
        return None, model
    return model, prompt


@handle_errors
@o.with_groups
def run(
    gen: o.Generation,
    model: o.ModelArg = None,
    prompt: Annotated[str, typer.Argument(help="The prompt, or - to read it from stdin.")] = "-",
    stats: Annotated[bool, typer.Option("--stats", help="Print speed to stderr.")] = False,
    raw: Annotated[bool, typer.Option(
        "--raw", help="Continue the prompt as plain text, without the chat template "
                      "(what a base model serves).")] = False,
    *,
    decoding: o.Decoding,
    json: o.Json = False,
    mcp: McpOpt = None,
    yes: YesOpt = False,
    max_steps: MaxStepsOpt = 8,
) -> None:
    """Answer one prompt and exit.

    The prompt is one chat turn in the model's chat template; --raw sends it
    as it is, for a base model to continue.

    With one argument that has a space in it, that is the prompt and the
    default model answers it. With --mcp the model may call the servers'
    tools (docs/mcp.md).

    Example: llmctl run smollm2 "Why is the sky blue?" --max-tokens 64
    """
    model, prompt = prompt_only(model, prompt)
    text = read_prompt(prompt)
    if not text.strip():
        raise UsageError("the prompt is empty")
    from llmctl.runtime.oneshot import run_prompt

    if not raw:
        note_base_model(model)

    params = gen.sampling()
    if mcp is not None:
        if raw:
            raise UsageError("--mcp needs the chat template, which --raw leaves out")
        _run_with_tools(model, text, gen, decoding, (mcp, yes, max_steps), json)
        return
    # One prompt, one answer: a prefix cache would only cost memory and
    # disk writes for no reuse.
    load = gen.load(prefix_cache=False, **decoding.load_fields())
    result = run_prompt(model, text, params, load, system=gen.system,
                        on_text=None if json else write_out, raw=raw)
    if json:
        print_json({"text": result.text, "prompt_tokens": result.usage.prompt_tokens,
                    "completion_tokens": result.usage.completion_tokens,
                    "ttft_s": round(result.ttft_s, 4),
                    "tokens_per_s": round(result.tokens_per_s, 2),
                    "finish_reason": result.finish_reason})
    else:
        write_out("\n")
    if stats:
        err.print(f"prompt {result.usage.prompt_tokens} tok, generated "
                  f"{result.usage.completion_tokens} tok, TTFT {result.ttft_s:.3f}s, "
                  f"{result.tokens_per_s:.1f} tok/s")


def _run_with_tools(model: str | None, text: str, gen: o.Generation, decoding: o.Decoding,
                    tools: tuple, json: bool) -> None:
    """The prompt answered with the --mcp servers' tools; the calls on
    stderr, the answer on stdout (or all of it as JSON)."""
    from contextlib import closing

    from llmctl.cli.mcp import TerminalWatcher, servers_for
    from llmctl.runtime.oneshot import load_for
    from llmctl.tools.agent import run_turn
    from llmctl.tools.mcp_hub import McpHub

    path, yes, max_steps = tools
    servers = servers_for(None if str(path) == "config" else path, required=True)
    messages = ([{"role": "system", "content": gen.system}] if gen.system else [])
    messages.append({"role": "user", "content": text})
    # The loop resends the conversation each step: the prefix cache pays.
    with load_for(model, gen.load(**decoding.load_fields())) as llm, \
            closing(McpHub(servers)) as hub:
        turn = run_turn(llm, messages, gen.sampling(), hub,
                        TerminalWatcher((lambda _: None) if json else write_out),
                        max_steps=max_steps, approve_all=yes)
    if json:
        print_json({"text": turn.answer, "stopped": turn.stopped,
                    "tool_calls": [{"name": name, "arguments": args, "output": got.text,
                                    "is_error": got.is_error} for name, args, got in turn.calls]})
        return
    if turn.stopped:
        err.print(f"[yellow]the tools were withdrawn after {max_steps} calls (--max-steps); "
                  "the model answered without them[/]")
    write_out("\n")


def register(app: typer.Typer) -> None:
    app.command("run")(run)

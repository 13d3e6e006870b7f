"""`llmctl list`, `llmctl show MODEL` and `llmctl rm MODEL`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from typing_extensions import Annotated

from llmctl.cli import options as o
from llmctl.cli.common import handle_errors, human_bytes, out, print_json
from llmctl.cli.complete import model_names
from llmctl.cli.tables import fitted, pairs
from llmctl.store.manage import list_models, remove_model, show_model

if TYPE_CHECKING:
    from llmctl.runtime.formats.template_source import TemplateSource


def human_count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


@handle_errors
def list_cmd(json: o.Json = False) -> None:
    """List models in the store, and registry names you can pull.

    Example: llmctl list --json
    """
    listing = list_models()
    if json:
        print_json({"models": [e.to_dict() for e in listing.local],
                    "available": listing.available})
        return
    rows = [[e.name, e.architecture, human_count(e.parameters), e.quant, human_bytes(e.size),
             str(e.context_length), e.source] for e in listing.local]
    out.print(fitted(("NAME", "ARCH", "PARAMS", "QUANT", "SIZE", "CONTEXT", "SOURCE"), rows, out,
                     whole=("NAME",), drops=("SOURCE", "CONTEXT", "ARCH"),
                     title="Local models", title_justify="left"))
    if listing.available:
        rows = [[m["name"], m["repo"], m["description"]] for m in listing.available]
        out.print(fitted(("NAME", "REPO", "DESCRIPTION"), rows, out, whole=("NAME",),
                         drops=("REPO",), title="Available (llmctl pull NAME)",
                         title_justify="left"))


def template_source(name: str, path: str) -> TemplateSource:
    """The chat template `name` at `path` gets when loaded, read from its
    GGUF header as LLM does from the loaded model. Raises BadModelFile for a
    file that is not a GGUF, UsageError for a malformed models.toml."""
    from llmctl.runtime.formats.template_source import choose_template
    from llmctl.store.gguf_header import read_header
    from llmctl.store.registry import load_registry

    header = read_header(path, keep_arrays=("tokenizer.ggml.tokens",))
    vocab = set(header.metadata.get("tokenizer.ggml.tokens") or ())
    spec = load_registry().get(name)
    return choose_template(override=spec.template if spec else None,
                           gguf=header.metadata.get("tokenizer.chat_template"),
                           architecture=header.architecture, has_token=vocab.__contains__)


@handle_errors
def show(
    model: o.ModelArg = None,
    ctx_size: o.CtxSize = None,
    kv_type: o.KvTypeOpt = o.KvType("f16"),
    json: o.Json = False,
) -> None:
    """Show a model's metadata and the memory it needs at a context size.

    Example: llmctl show smollm2 --ctx-size 8192 --kv-type q8_0
    """
    data = show_model(model, ctx_size, kv_type.value)
    data["chat_template"] = template_source(data["model"], data["path"]).describe()
    if json:
        print_json(data)
        return
    mem = data.pop("memory")
    rows = []
    for key, value in data.items():
        if key == "parameters":
            value = f"{human_count(value)} ({value:,})"
        elif key == "size":
            value = human_bytes(value)
        rows.append((f"[bold]{key}[/]", escape(str(value))))
    rows.append(("[bold]kv_type[/]", mem["kv_type"]))
    rows.append(("[bold]memory[/]",
                 f"{human_bytes(mem['total_bytes'])} at ctx {mem['ctx_size']} = weights "
                 f"{human_bytes(mem['weights_bytes'])} + KV cache "
                 f"{human_bytes(mem['kv_cache_bytes'])}"))
    out.print(pairs(rows))


@handle_errors
def rm(
    model: Annotated[str, typer.Argument(help="Name of a model in the store.",
                                         autocompletion=model_names)],
    json: o.Json = False,
) -> None:
    """Remove a model from the store, and the file it downloaded.

    A file the store did not download (a path you added) is kept.

    Example: llmctl rm qwen2.5-0.5b
    """
    entry = remove_model(model)
    if json:
        print_json({"removed": entry.name, "path": entry.path, "deleted_file": entry.owned})
    else:
        what = "deleted " + entry.path if entry.owned else "file kept: " + entry.path
        out.print(f"Removed {entry.name} ({what})", markup=False)


def register(app: typer.Typer) -> None:
    app.command("list")(list_cmd)
    app.command("show")(show)
    app.command("rm")(rm)

"""Options shared by the commands that load a model and generate, declared
once so `chat`, `run` and `serve` spell and document them the same way.
Each also reads an `LLMCTL_*` environment variable."""

from __future__ import annotations

from typing import Optional

import typer
from typing_extensions import Annotated

from llmctl.runtime.planner import parse_gpu_layers


ModelArg = Annotated[Optional[str], typer.Argument(
    help="models.toml name, store name, or path to a .gguf file (default: smollm2).",
    envvar="LLMCTL_MODEL", show_default=False)]
Temperature = Annotated[float, typer.Option(
    "--temperature", min=0.0, envvar="LLMCTL_TEMPERATURE", help="0 = greedy.")]
TopP = Annotated[float, typer.Option("--top-p", min=0.0, max=1.0, envvar="LLMCTL_TOP_P")]
TopK = Annotated[int, typer.Option("--top-k", min=0, envvar="LLMCTL_TOP_K", help="0 = off.")]
Seed = Annotated[Optional[int], typer.Option("--seed", envvar="LLMCTL_SEED")]
MaxTokens = Annotated[Optional[int], typer.Option(
    "--max-tokens", min=1, envvar="LLMCTL_MAX_TOKENS", help="Default: until the context is full.")]
CtxSize = Annotated[Optional[int], typer.Option(
    "--ctx-size", min=64, envvar="LLMCTL_CTX_SIZE",
    help="Context tokens per sequence (default: the model's registry value or 4096).")]
Threads = Annotated[Optional[int], typer.Option(
    "--threads", min=1, envvar="LLMCTL_THREADS", help="Default: physical cores.")]
def _check_gpu_layers(value: str) -> str:
    """Typer can't type 'auto|N'; the planner's own parser decides, and a
    bad value becomes a usage error here rather than at model load."""
    try:
        parse_gpu_layers(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r}: use auto, -1 (all) or a number >= 0",
                                 param_hint="--n-gpu-layers") from None
    return value


GpuLayers = Annotated[str, typer.Option(
    "--n-gpu-layers", envvar="LLMCTL_N_GPU_LAYERS", callback=_check_gpu_layers,
    help="Layers to offload to the GPU: auto or a number (0 = CPU only).")]
System = Annotated[Optional[str], typer.Option("--system", help="System prompt.")]
Json = Annotated[bool, typer.Option("--json", help="Machine-readable JSON output.")]



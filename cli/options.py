"""Options shared by the commands that load a model and generate, declared
once so `chat`, `run` and `serve` spell and document them the same way.
Each also reads an `LLMCTL_*` environment variable.

Only typer, the runtime's speculation defaults (constants) and the preset
type (llmctl/presets.py imports nothing heavy) are imported at module
level: every command module imports this one, so `llmctl CMD --help` pays
for nothing more."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import typing
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

import typer
from typing_extensions import Annotated

from llmctl.cli.complete import model_names
from llmctl.kv_types import KV_TYPES
from llmctl.presets import Preset
from llmctl.runtime.speculation.spec_config import AUTO_DRAFT_MAX, DRAFT_MAX, DRAFT_MIN, P_MIN

if TYPE_CHECKING:
    from llmctl.runtime.llm import LoadOptions
    from llmctl.runtime.sampling import SamplingParams

T = TypeVar("T", bound=type)

ModelArg = Annotated[Optional[str], typer.Argument(
    help="models.toml name, store name, or .gguf path (default: qwen2.5-coder-1.5b).",
    envvar="LLMCTL_MODEL", show_default=False, autocompletion=model_names)]
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
    from llmctl.runtime.planner import parse_gpu_layers

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
Format = Annotated[Optional[str], typer.Option(
    "--format", envvar="LLMCTL_FORMAT", help="json: every answer is one JSON object.")]
JsonSchema = Annotated[Optional[Path], typer.Option(
    "--json-schema", help="A JSON Schema file every answer must validate against.")]


_GROUPS: set[type] = set()


def option_group(cls: T) -> T:
    """Mark the dataclass `cls` as a group of options for with_groups."""
    _GROUPS.add(cls)
    return cls


@option_group
@dataclasses.dataclass(frozen=True)
class Generation:
    """The load and sampling options of `chat` and `run`. Each field is one
    CLI option: its annotation declares the flag, its default the default."""

    system: System = None
    temperature: Temperature = 0.8
    top_p: TopP = 0.95
    top_k: TopK = 40
    seed: Seed = None
    max_tokens: MaxTokens = None
    ctx_size: CtxSize = None
    threads: Threads = None
    n_gpu_layers: GpuLayers = "auto"
    format: Format = None
    json_schema: JsonSchema = None

    def with_preset(self, model: str | None) -> Generation:
        """These options with the preset `model` names (if it names one)
        applied: its values replace the config file's and the built-in
        defaults, never a flag or an LLMCTL_* variable the user set.
        Raises ConfigError for a bad preset."""
        from llmctl.presets import find_preset

        preset = find_preset(model)
        if preset is None:
            return self
        values = {"system": preset.system, **preset.sampling}
        changes = {name: value for name, value in values.items()
                   if name in _OWN and value is not None and not _user_set(name)}
        mine = {name: getattr(self, name) for name in _OWN}
        return _PresetGeneration(**{**mine, **changes}, preset=preset)

    def _unflagged(self) -> dict[str, Any]:
        """SamplingParams fields set where no option says (a preset's)."""
        return {}

    def sampling(self) -> SamplingParams:
        """The sampling half: the options, over a preset's fields that
        have no option. Raises InvalidParams for out-of-range values
        and UsageError for an unknown --format or an unreadable schema."""
        from llmctl.runtime.sampling import SamplingParams

        return SamplingParams(temperature=self.temperature, top_p=self.top_p,
                              top_k=self.top_k, seed=self.seed, max_tokens=self.max_tokens,
                              grammar=self._grammar(), **self._unflagged())

    def _grammar(self) -> str | None:
        from llmctl.errors import UsageError
        from llmctl.runtime.formats.grammar import json_object_grammar, json_schema_grammar

        if self.format not in (None, "json"):
            raise UsageError(f"--format {self.format!r}: only json is supported")
        if self.json_schema is not None:
            try:
                schema = json.loads(self.json_schema.read_text())
            except (OSError, ValueError) as e:
                raise UsageError(f"cannot read the JSON Schema {self.json_schema}: {e}") from None
            return json_schema_grammar(schema)
        return json_object_grammar() if self.format == "json" else None

    def load(self, **extra: Any) -> LoadOptions:
        """The load half, plus the command's own `extra` LoadOptions fields.
        Raises UsageError for impossible values. Imports the runtime (and
        llama.cpp), so call it only when a model is about to load."""
        from llmctl.runtime.llm import LoadOptions
        from llmctl.settings import Settings

        return LoadOptions(ctx_size=self.ctx_size, threads=self.threads,
                           n_gpu_layers=self.n_gpu_layers, settings=Settings.load(), **extra)


_OWN = tuple(Generation.__dataclass_fields__)


@dataclasses.dataclass(frozen=True)
class _PresetGeneration(Generation):
    """Generation options with a preset applied (Generation.with_preset):
    the preset's fields that no option has ride along."""

    preset: Optional[Preset] = None

    def _unflagged(self) -> dict[str, Any]:
        sampling = self.preset.sampling if self.preset else {}
        return {k: v for k, v in sampling.items() if k not in _OWN}


def with_groups(fn: Callable) -> Callable:
    """Expose the fields of each option group (a dataclass marked with
    @option_group, such as Generation) as separate options of the command
    `fn`, in place of its parameter annotated with that group, and call `fn`
    with them gathered into the group. Typer builds a command from the
    signature, so the returned function carries the expanded one.

    Raises ValueError at decoration if `fn` has no such parameter."""
    signature = inspect.signature(fn, eval_str=True)
    groups = {p.name: p.annotation for p in signature.parameters.values()
              if p.annotation in _GROUPS}
    if not groups:
        raise ValueError(f"{fn.__name__} needs a parameter annotated with an option group")
    fields = {name: _expand(group, signature.parameters[name]) for name, group in groups.items()}
    params = [q for p in signature.parameters.values()
              for q in (fields[p.name] if p.name in fields else [p])]

    def gather(kwargs: dict[str, Any]) -> dict[str, Any]:
        gathered = {name: groups[name](**{p.name: kwargs.pop(p.name) for p in fields[name]})
                    for name in groups}
        # A preset named as the model sets the generation options' defaults.
        return {name: group.with_preset(kwargs.get("model"))
                if isinstance(group, Generation) else group for name, group in gathered.items()}

    return replace_parameters(fn, params, gather)


def _expand(group: type, slot: inspect.Parameter) -> list[inspect.Parameter]:
    """The fields of `group` as parameters of the kind of `slot`."""
    hints = typing.get_type_hints(group, include_extras=True)
    return [inspect.Parameter(f.name, slot.kind, default=f.default, annotation=hints[f.name])
            for f in dataclasses.fields(group)]


def _user_set(name: str) -> bool:
    """Whether the user gave the current command's parameter `name` (a
    flag or an LLMCTL_* variable), rather than the config file or the
    default. Raises nothing."""
    # Typer runs on its own copy of click: the command's context is on that one's stack.
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return getattr(source, "name", None) in ("COMMANDLINE", "ENVIRONMENT")


def replace_parameters(fn: Callable, params: list[inspect.Parameter],
                       gather: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable:
    """`fn` as a command whose signature is `params`: `gather` takes the
    parameters `fn` lacks out of the keyword arguments (it pops them) and
    returns those `fn` takes in their place."""

    @functools.wraps(fn)
    def command(**kwargs: Any) -> Any:
        gathered = gather(kwargs)
        return fn(**kwargs, **gathered)

    signature = inspect.signature(fn, eval_str=True)
    command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command


# --kv-type's choices, from the one list the runtime and planner use.
# Built from a list, so mypy sees no members; only `.value` is used.
KvType = Enum("KvType", {name: name for name in KV_TYPES}, type=str)  # type: ignore[misc]
KvTypeOpt = Annotated[KvType, typer.Option(
    "--kv-type", envvar="LLMCTL_KV_TYPE",
    help="K and V cache element type: q8_0 takes about half the memory of f16, q4_0 about a "
         "quarter; both need flash attention (auto turns it on).")]


class BackendSampling(str, Enum):
    auto = "auto"
    on = "on"
    off = "off"


BackendSamplingOpt = Annotated[BackendSampling, typer.Option(
    "--backend-sampling", envvar="LLMCTL_BACKEND_SAMPLING",
    help="Sample inside llama.cpp's graph, so only the chosen token leaves the device, for "
         "requests without a grammar, penalties or logprobs (the others sample on the host). "
         "auto: on with the model wholly on a GPU.")]
_BACKEND_SAMPLING = {BackendSampling.auto: None, BackendSampling.on: True,
                     BackendSampling.off: False}
DeterministicOpt = Annotated[bool, typer.Option(
    "--deterministic", envvar="LLMCTL_DETERMINISTIC",
    help="Kept for scripts: greedy answers are byte-identical whatever else runs by default; "
         "this refuses the settings that break it (--repack, --flash-attn off). See "
         "docs/exactness.md.")]
RepackOpt = Annotated[bool, typer.Option(
    "--repack", envvar="LLMCTL_REPACK",
    help="Let ggml repack quantized weights for its own kernels: a one-sequence step of a "
         "K-quant 1.5B is about 10% faster on some CPUs, but a row then rounds by its batch, so "
         "a greedy answer may change with the load (docs/exactness.md).")]


class Spec(str, Enum):
    auto = "auto"
    off = "off"
    none = "none"       # the older spelling of off
    ngram = "ngram"
    draft = "draft"


# Speculative decoding: declared once for serve, run and chat.
SpecOpt = Annotated[Spec, typer.Option(
    "--spec", envvar="LLMCTL_SPEC",
    help="Guess the next tokens and check them in one batched step; each token is still the "
         "model's own choice (token for token plain decoding's where llama.cpp's kernels allow: "
         "see the README). auto (the default): n-gram guesses only where they pay, as measured "
         "per sequence on this machine. off: none. ngram: always, from the prompt and output "
         "so far (prompt lookup). draft: with a small model of the same family (--draft, or "
         "the model's registry default).")]
DraftOpt = Annotated[Optional[str], typer.Option(
    "--draft", envvar="LLMCTL_DRAFT", metavar="MODEL",
    help="Draft model for speculation (turns --spec draft on): a registry name, store name or "
         "GGUF path with the same tokenizer, e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b.",
    autocompletion=model_names)]
DraftPMin = Annotated[float, typer.Option(
    "--draft-p-min", min=0.0, max=1.0, envvar="LLMCTL_DRAFT_P_MIN",
    help="A draft model stops guessing where its top token's probability is below this.")]
DraftMax = Annotated[Optional[int], typer.Option(
    "--draft-max", min=1, max=64, envvar="LLMCTL_DRAFT_MAX", show_default=False,
    help=f"Most guessed tokens per step, fewer as the batch fills "
         f"(default: {AUTO_DRAFT_MAX} under --spec auto, else {DRAFT_MAX}).")]
DraftMin = Annotated[int, typer.Option(
    "--draft-min", min=1, max=64, envvar="LLMCTL_DRAFT_MIN",
    help="Don't speculate with fewer guesses than this.")]


@option_group
@dataclasses.dataclass(frozen=True)
class Decoding:
    """--kv-type, the speculation options, --backend-sampling, --repack and
    --deterministic of `chat`, `run` and `serve`, with the runtime's defaults."""

    kv_type: KvTypeOpt = KvType("f16")
    spec: SpecOpt = Spec.auto
    draft_max: DraftMax = None
    draft_min: DraftMin = DRAFT_MIN
    draft: DraftOpt = None
    draft_p_min: DraftPMin = P_MIN
    backend_sampling: BackendSamplingOpt = BackendSampling.auto
    repack: RepackOpt = False
    deterministic: DeterministicOpt = False

    def load_fields(self) -> dict[str, Any]:
        """The LoadOptions fields these options set."""
        return {"kv_type": self.kv_type.value,
                "spec": _spec_mode(self.spec, self.draft),
                "draft_max": self.draft_max, "draft_min": self.draft_min, "draft": self.draft,
                "draft_p_min": self.draft_p_min,
                "backend_sampling": _BACKEND_SAMPLING[self.backend_sampling],
                "repack": self.repack, "deterministic": self.deterministic}


def _spec_mode(spec: Spec, draft: str | None) -> str | None:
    """LoadOptions' speculation mode: naming a draft model under auto means
    speculating with it."""
    if spec in (Spec.off, Spec.none):
        return None
    if spec is Spec.auto and draft is not None:
        return "draft"
    return spec.value

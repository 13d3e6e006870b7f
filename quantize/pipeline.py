"""`llmctl quantize`: source → (convert) → quantize → register → (check).
Every file is written under a temporary name and renamed into place, so a
failure or Ctrl-C never leaves a partial model behind."""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from llmctl import settings
from llmctl.errors import UsageError
from llmctl.files import clean_stale_tmp, require_space, staged, tmp_path
from llmctl.quantize.llama_quant import llama_quantize
from llmctl.quantize.source import SourceModel, resolve_source
from llmctl.quantize.space import estimate_bytes
from llmctl.quantize.types import FLOAT_TYPES, QuantType, resolve_type
from llmctl.store.gguf_header import read_header
from llmctl.store.gguf_info import file_type_name

# progress(phase, done, total): phase is "convert", "quantize" or "check".
Progress = Callable[[str, int, int], None]


@dataclass
class QuantizeResult:
    name: str
    path: str
    type: str
    source: str
    source_path: str
    size_before: int
    size_after: int
    seconds: float
    intermediate: str | None = None     # kept F16/BF16 GGUF (--keep-f16)
    check: dict | None = None           # perplexity of source and result
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def default_output(source: SourceModel, qtype: QuantType) -> Path:
    return settings.models_dir() / "quantized" / f"{source.name}-{qtype.name}.gguf"


def _check_output(path: Path, force: bool) -> None:
    if path.is_dir():
        raise UsageError(f"output {path} is a directory", param="output")
    if path.exists() and not force:
        raise UsageError(f"output {path} already exists (pass --force to overwrite)",
                         param="output")


def _input_elements(path: Path, allow_requantize: bool, warnings: list[str]) -> int:
    """Refuse (or warn about) quantized input; return the weight count."""
    header = read_header(path)
    kinds = header.tensor_type_names() - {"F32", "F16", "BF16"}
    ftype = file_type_name(header.metadata.get("general.file_type"))
    if kinds:
        found = ftype if ftype not in FLOAT_TYPES else "/".join(sorted(kinds))
        if not allow_requantize:
            raise UsageError(f"{path} is already quantized ({found}); quantize the F16/BF16 "
                             "original, or pass --allow-requantize (quality drops)")
        warnings.append(f"requantizing a {found} model: errors compound, expect lower "
                        "quality than quantizing the F16/BF16 original")
    return header.n_elements


def quantize_model(model: str, *, bits: int | None = None, type: str | None = None,
                   output: str | Path | None = None, threads: int | None = None,
                   allow_requantize: bool = False, check: bool = False,
                   keep_f16: bool = False, force: bool = False,
                   check_file: str | Path | None = None, check_chunks: int | None = None,
                   progress: Progress | None = None) -> QuantizeResult:
    """Quantize `model` (GGUF, or safetensors converted first) and register
    the result. Raises UsageError (bad type, existing output, quantized
    input), ModelNotFound, BadModelFile and DiskSpaceError."""
    from llmctl.quantize.registry import register_result

    qtype = resolve_type(bits, type)
    source = resolve_source(model)
    out = Path(output).expanduser() if output else default_output(source, qtype)
    _check_output(out, force)
    # Temps of quantize runs that were killed: nothing else would delete them.
    clean_stale_tmp(out.parent)
    text = _check_text(check_file) if check else None
    started = time.perf_counter()
    warnings: list[str] = []
    owned = _is_under(out, settings.models_dir())
    extra = {"source_path": str(source.path.resolve())}
    intermediate = None
    if source.kind == "hf":
        gguf_in, intermediate = _convert(source, out, keep_f16, force, progress)
        extra["converted_from"] = "safetensors"
        if intermediate is not None:
            # Registered at once: it is a complete model even if quantizing fails.
            dtype = intermediate.stem.rsplit("-", 1)[-1]
            register_result(f"{source.name}:{dtype.lower()}", intermediate, source=source.label,
                            quant_type=dtype, owned=owned, extra=extra)
    else:
        gguf_in = source.path
        if keep_f16:
            warnings.append("--keep-f16 only applies to safetensors input; ignored")
    try:
        n_elements = _input_elements(gguf_in, allow_requantize, warnings)
        require_space(out.parent, estimate_bytes(n_elements, qtype.name), f"the {qtype.name} file")
        with staged(out) as tmp:
            llama_quantize(gguf_in, tmp, qtype.ftype, threads=threads,
                           allow_requantize=allow_requantize, progress=_phase(progress, "quantize"))
        name = f"{source.name}:{qtype.tag}"
        register_result(name, out, source=source.label, quant_type=qtype.name, owned=owned,
                        extra=extra)
        result = QuantizeResult(name=name, path=str(out), type=qtype.name, source=source.label,
                                source_path=str(source.path), size_before=source.size,
                                size_after=out.stat().st_size,
                                seconds=time.perf_counter() - started, warnings=warnings,
                                intermediate=str(intermediate) if intermediate else None)
        if text is not None:      # read when `check`
            result.check = _quality_check(gguf_in, out, text, threads, check_chunks, progress)
    finally:
        if source.kind == "hf" and intermediate is None:
            with contextlib.suppress(FileNotFoundError):
                gguf_in.unlink()
    return result


def _is_under(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def _convert(source: SourceModel, out: Path, keep: bool, force: bool,
             progress: Progress | None) -> tuple[Path, Path | None]:
    """Safetensors → GGUF. Returns (file to quantize, kept file or None)."""
    from llmctl.quantize.convert import convert_hf, planned_dtype

    require_space(out.parent, int(source.size * 1.05) + (16 << 20) +
                  estimate_bytes(source.size // 2, "Q8_0"), "the converted model")
    if keep:
        kept = out.with_name(f"{source.name}-{planned_dtype(source.path)}.gguf")
        _check_output(kept, force)
        with staged(kept) as tmp:
            convert_hf(source.path, tmp, name=source.name, progress=_phase(progress, "convert"))
        return kept, kept
    tmp = tmp_path(out.with_name(f"{out.name.removesuffix('.gguf')}.convert"))
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        convert_hf(source.path, tmp, name=source.name, progress=_phase(progress, "convert"))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return tmp, None


def _phase(progress: Progress | None, phase: str):
    return (lambda d, t: progress(phase, d, t)) if progress else None


def _check_text(check_file: str | Path | None) -> str:
    from llmctl.quantize.evaltext import load_text

    return load_text(check_file)


def _quality_check(source: Path, result: Path, text: str, threads: int | None,
                   chunks: int | None, progress: Progress | None) -> dict:
    from llmctl.quantize.perplexity import perplexity

    rows: dict[str, Any] = {}
    for label, path in (("source", source), ("result", result)):
        ppl = perplexity(path, text, threads=threads, max_chunks=chunks,
                         progress=_phase(progress, f"check {label}"))
        rows[label] = {"path": str(path), "perplexity": ppl.perplexity, "stderr": ppl.stderr,
                       "size": path.stat().st_size, "chunks": ppl.chunks}
    rows["delta_pct"] = 100.0 * (rows["result"]["perplexity"] / rows["source"]["perplexity"] - 1)
    return rows

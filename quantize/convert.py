"""Hugging Face safetensors → GGUF (F16 or BF16, norms in F32), written with
gguf's GGUFWriter one tensor at a time: all tensor infos first, then each
tensor's bytes streamed from the mmap, so peak memory stays near one tensor."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from llmctl.errors import BadModelFile
from llmctl.quantize.hf_config import HFConfig, llama3_rope_factors, load_config, write_hparams
from llmctl.quantize.hf_tokenizer import write_vocab
from llmctl.quantize.safetensors_io import TensorReader, TensorRef, bf16_to_f32, list_tensors

# Buffers HF checkpoints carry that are not weights.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass
class ConvertResult:
    path: Path
    dtype: str            # "F16" or "BF16"
    tensors: int
    bytes_read: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.bytes_read / 1e6 / self.seconds if self.seconds else 0.0


@dataclass
class _Plan:
    name: str                       # GGUF tensor name
    ref: TensorRef | None
    shape: tuple[int, ...]
    out: str                        # "F32", "F16" or "BF16"
    permute_heads: int = 0          # >0: rope-permute rows with this many heads
    data: np.ndarray | None = None  # generated tensors (rope_freqs)


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's Q/K rows are laid out for rotate-half rope; llama.cpp's llama
    graph rotates interleaved pairs. Same formula as convert_hf_to_gguf."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _out_dtype(refs: dict[str, TensorRef]) -> str:
    dtypes = {r.dtype for r in refs.values() if len(r.shape) > 1}
    bad = dtypes - {"F32", "F16", "BF16"}
    if bad:
        raise BadModelFile(f"unsupported weight dtype {', '.join(sorted(bad))}; "
                           f"supported: F32, F16, BF16")
    return "BF16" if "BF16" in dtypes else "F16"


def planned_dtype(model_dir: str | Path) -> str:
    """The dtype `convert_hf` will write for 2-D weights: "F16" or "BF16"."""
    return _out_dtype(list_tensors(Path(model_dir)))


def _plan(cfg: HFConfig, refs: dict[str, TensorRef]) -> list[_Plan]:
    import gguf

    tmap = gguf.get_tensor_name_map(cfg.gguf_arch, cfg.n_layers)
    out2d = _out_dtype(refs)
    plans = []
    for ref in sorted(refs.values(), key=lambda r: (str(r.file), r.start)):
        if ref.name.endswith(_IGNORED_SUFFIXES):
            continue
        name = tmap.get_name(ref.name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise BadModelFile(f"unexpected tensor {ref.name!r} for {cfg.arch_name}")
        heads = 0
        if cfg.spec.permute_qk and name.endswith("attn_q.weight"):
            heads = cfg.n_head
        elif cfg.spec.permute_qk and name.endswith("attn_k.weight"):
            heads = cfg.n_head_kv
        plans.append(_Plan(name, ref, ref.shape, "F32" if len(ref.shape) == 1 else out2d, heads))
    factors = llama3_rope_factors(cfg)
    if factors is not None:
        plans.append(_Plan("rope_freqs.weight", None, factors.shape, "F32", data=factors))
    return plans


def _load(reader: TensorReader, plan: _Plan) -> np.ndarray:
    if plan.data is not None:
        return plan.data
    assert plan.ref is not None, plan.name     # a plan has data or a source tensor
    w = reader.view(plan.ref)
    src = plan.ref.dtype
    if plan.out == "F32":
        w = bf16_to_f32(w) if src == "BF16" else w.astype(np.float32, copy=False)
    elif plan.out == "F16" and src != "F16":
        w = (bf16_to_f32(w) if src == "BF16" else w).astype(np.float16)
    if plan.permute_heads:
        w = permute_qk(w, plan.permute_heads)
    return w


_NP = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def convert_hf(model_dir: str | Path, output: str | Path, *, name: str | None = None,
               progress: Callable[[int, int], None] | None = None) -> ConvertResult:
    """Write `output` (the caller renames it into place) from `model_dir`."""
    import gguf

    model_dir, output = Path(model_dir), Path(output)
    started = time.perf_counter()
    cfg = load_config(model_dir)
    refs = list_tensors(model_dir)
    plans = _plan(cfg, refs)
    out2d = _out_dtype(refs)
    writer = gguf.GGUFWriter(None, gguf.MODEL_ARCH_NAMES[cfg.gguf_arch])
    writer.add_name(name or model_dir.name)
    write_hparams(writer, cfg)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if out2d == "BF16"
                         else gguf.LlamaFileType.MOSTLY_F16)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_vocab(writer, model_dir, cfg.vocab_size)
    for p in plans:
        dtype = np.dtype(_NP[p.out])
        nbytes = int(np.prod(p.shape)) * dtype.itemsize
        raw = gguf.GGMLQuantizationType.BF16 if p.out == "BF16" else None
        writer.add_tensor_info(p.name, p.shape, dtype, nbytes, raw_dtype=raw)
    total = sum(p.ref.nbytes for p in plans if p.ref)
    done = 0
    with TensorReader() as reader, contextlib.closing(writer):
        writer.write_header_to_file(output)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for p in plans:
            writer.write_tensor_data(np.ascontiguousarray(_load(reader, p)))
            done += p.ref.nbytes if p.ref else 0
            if progress:
                progress(done, total)
        assert writer.fout is not None         # opened by write_header_to_file
        writer.fout[0].flush()
        os.fsync(writer.fout[0].fileno())
    return ConvertResult(output, out2d, len(plans), total, time.perf_counter() - started)

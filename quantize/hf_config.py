"""Hugging Face config.json → GGUF hyperparameters, for the architectures the
converter supports. llama.cpp reads these keys to build the graph, so each
one mirrors what llama.cpp's convert_hf_to_gguf.py writes for the family."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmctl.errors import BadModelFile, UsageError


@dataclass(frozen=True)
class ArchSpec:
    gguf_arch: str        # gguf.MODEL_ARCH member name
    permute_qk: bool      # HF stores Q/K for NEOX-style rope; llama.cpp's llama wants GPT-J


ARCHITECTURES = {
    "LlamaForCausalLM": ArchSpec("LLAMA", permute_qk=True),
    "MistralForCausalLM": ArchSpec("LLAMA", permute_qk=True),
    "Qwen2ForCausalLM": ArchSpec("QWEN2", permute_qk=False),
}


@dataclass
class HFConfig:
    raw: dict
    arch_name: str
    spec: ArchSpec

    @property
    def n_layers(self) -> int:
        return int(self.raw["num_hidden_layers"])

    @property
    def n_head(self) -> int:
        return int(self.raw["num_attention_heads"])

    @property
    def n_head_kv(self) -> int:
        return int(self.raw.get("num_key_value_heads") or self.n_head)

    @property
    def head_dim(self) -> int:
        return int(self.raw.get("head_dim") or self.raw["hidden_size"] // self.n_head)

    @property
    def vocab_size(self) -> int:
        return int(self.raw["vocab_size"])

    @property
    def gguf_arch(self):
        import gguf

        return gguf.MODEL_ARCH[self.spec.gguf_arch]


def is_hf_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def load_config(model_dir: Path) -> HFConfig:
    try:
        raw = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise BadModelFile(f"{model_dir / 'config.json'}: unreadable ({e})") from e
    archs = raw.get("architectures") or []
    name = archs[0] if archs else raw.get("model_type", "unknown")
    spec = ARCHITECTURES.get(name)
    if spec is None:
        raise UsageError(f"unsupported architecture {name!r}; the converter supports "
                         f"{', '.join(ARCHITECTURES)}")
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                           "intermediate_size", "vocab_size") if k not in raw]
    if missing:
        raise BadModelFile(f"{model_dir / 'config.json'}: missing {', '.join(missing)}")
    return HFConfig(raw, name, spec)


def write_hparams(writer, cfg: HFConfig) -> None:
    import gguf

    h = cfg.raw
    writer.add_context_length(int(h.get("max_position_embeddings", 4096)))
    writer.add_embedding_length(int(h["hidden_size"]))
    writer.add_feed_forward_length(int(h["intermediate_size"]))
    writer.add_block_count(cfg.n_layers)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_head_kv)
    writer.add_rope_freq_base(float(h.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(h.get("rms_norm_eps", 1e-6)))
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_rope_dimension_count(cfg.head_dim)
    if h.get("head_dim") and cfg.head_dim != h["hidden_size"] // cfg.n_head:
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
    scaling = h.get("rope_scaling") or {}
    kind = (scaling.get("rope_type") or scaling.get("type") or "").lower()
    if kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(scaling["factor"]))
    elif kind == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(scaling["factor"]))
        writer.add_rope_scaling_orig_ctx_len(int(scaling["original_max_position_embeddings"]))


def llama3_rope_factors(cfg: HFConfig) -> np.ndarray | None:
    """Llama 3.1+ scale rope frequencies per dimension; llama.cpp takes the
    factors as a `rope_freqs` tensor (same formula as convert_hf_to_gguf)."""
    scaling = cfg.raw.get("rope_scaling") or {}
    if (scaling.get("rope_type") or "").lower() != "llama3":
        return None
    base = float(cfg.raw.get("rope_theta", 10000.0))
    dim = cfg.head_dim
    factor = float(scaling.get("factor", 8.0))
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    factors = []
    for freq in 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim)):
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)

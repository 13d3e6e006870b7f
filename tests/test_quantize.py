"""`llmctl quantize` and `llmctl eval perplexity`, with real weights derived
from the bundled SmolLM2: an F16 GGUF and a Hugging Face safetensors export."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llmctl.cli.app import app  # noqa: E402
from quantize_helpers import SPM_WORDS, export_hf_dir, make_f16_gguf, make_tiny_hf  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
LLMCTL = str(Path(sys.executable).with_name("llmctl"))
REPO_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a keeper"]
SAMPLES = ["Hello, world! Plain ASCII 12345.", "Crème brûlée, naïve façade, Ångström, São Paulo",
           "Emoji: 🚀🔥👍🏽 and 日本語のテキスト", "def f(x):\n    return {'k': [x ** 2, 0x1F]}  # code",
           "<|im_start|>user\nhi<|im_end|>"]


def invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line_error(result) -> str:
    text = (result.stderr if hasattr(result, "stderr") else result.output).strip()
    assert result.exit_code != 0, text
    assert "Traceback" not in text, text
    lines = text.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), text
    return lines[0]


def tensors(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    import gguf

    return {t.name: (t.tensor_type.name, np.asarray(t.data)) for t in gguf.GGUFReader(path).tensors}


@pytest.fixture(scope="session")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("quantize")


@pytest.fixture(scope="session")
def f16_gguf(work) -> Path:
    return make_f16_gguf(work / "smollm2-f16.gguf")


@pytest.fixture(scope="session")
def hf_dir(work, f16_gguf) -> Path:
    return export_hf_dir(f16_gguf, work / "SmolLM2-135M-Instruct")


@pytest.fixture(scope="session")
def q4_from_repo(work, hf_dir, session_home) -> dict:
    """Quantize a 'pulled' repo id (the hub's snapshot lookup points at the
    export) to Q4_K_M, keeping the converted F16."""
    import llmctl.hub

    out = work / "smollm2-q4_k_m.gguf"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMCTL_HOME", str(session_home))
        mp.setattr(llmctl.hub, "local_snapshot", lambda repo, revision=None:
                   hf_dir if repo == REPO_ID else None)
        r = invoke("quantize", REPO_ID, "--bits", "4", "--keep-f16", "-o", out, "--threads", "2",
                   "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.fixture(scope="session")
def q8_checked(work, f16_gguf, session_home) -> dict:
    out = work / "smollm2-q8_0.gguf"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMCTL_HOME", str(session_home))
        r = invoke("quantize", f16_gguf, "--bits", "8", "-o", out, "--check", "--check-chunks", "2",
                   "--threads", "2", "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_safetensors_convert_is_lossless(q4_from_repo, f16_gguf):
    kept = Path(q4_from_repo["intermediate"])
    assert kept.name.endswith("-F16.gguf")
    ours, ref = tensors(kept), tensors(f16_gguf)
    assert ours.keys() == ref.keys()
    for name, (ttype, data) in ref.items():
        assert ours[name][0] == ttype, name
        assert np.array_equal(ours[name][1], data), name
    assert {t for t, _ in ours.values()} == {"F16", "F32"}
    assert all(t == "F32" for n, (t, _) in ours.items() if "norm" in n)


def _load(path: Path):
    from llama_cpp import Llama

    return Llama(str(path), n_ctx=256, n_threads=2, verbose=False)


def test_converted_model_generates_and_tokenizes_like_source(q4_from_repo, f16_gguf):
    kept = Path(q4_from_repo["intermediate"])
    outputs = {}
    for label, path in (("source", f16_gguf), ("converted", kept)):
        llm = _load(path)
        toks = [llm.tokenize(s.encode(), add_bos=False, special=True) for s in SAMPLES]
        gen = []
        for p in PROMPTS:
            out = llm.create_completion(p, max_tokens=8, temperature=0.0, top_k=1)
            gen.append(out["choices"][0]["text"])
        meta = {k: v for k, v in llm.metadata.items() if k.startswith("tokenizer.")}
        outputs[label] = (toks, gen, meta)
        del llm
    assert outputs["converted"][0] == outputs["source"][0]
    assert outputs["converted"][1] == outputs["source"][1]
    assert all(t.strip() for t in outputs["source"][1])
    src_meta, conv_meta = outputs["source"][2], outputs["converted"][2]
    for key in ("tokenizer.ggml.pre", "tokenizer.ggml.model", "tokenizer.chat_template",
                "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
        assert conv_meta.get(key) == src_meta.get(key), key


def test_q4_k_m_types_registration_and_library_parity(q4_from_repo, work):
    import llama_cpp

    from llmctl.store import StoreIndex
    from llmctl.store.gguf_header import read_header

    path = Path(q4_from_repo["path"])
    header = read_header(path)
    assert header.metadata["general.file_type"] == llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    # 576-wide rows are not a multiple of 256, so llama.cpp falls back to
    # Q5_0/Q8_0 for some tensors, as llama-quantize does.
    assert {"Q4_K", "Q6_K", "F32"} <= header.tensor_type_names() <= {
        "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "F32"}
    entry = StoreIndex().get("smollm2-135m-instruct:q4_k_m")
    assert entry is not None and Path(entry.path) == path.resolve()
    assert entry.source == f"hf:{REPO_ID}" and entry.extra["quant_type"] == "Q4_K_M"
    assert entry.quant == "Q4_K_M" and not entry.owned       # --output outside the store
    assert StoreIndex().get("smollm2-135m-instruct:f16") is not None
    # The same input through the bare binding gives the same tensors.
    bare = work / "bare-q4_k_m.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, 2
    assert llama_cpp.llama_model_quantize(q4_from_repo["intermediate"].encode(),
                                          str(bare).encode(), params) == 0
    ours, ref = tensors(path), tensors(bare)
    assert ours.keys() == ref.keys()
    assert all(ours[n][0] == t and np.array_equal(ours[n][1], d) for n, (t, d) in ref.items())
    assert q4_from_repo["size_after"] < 0.45 * q4_from_repo["size_before"]


def test_q8_0_types_and_perplexity_within_one_percent(q8_checked):
    from llmctl.store.gguf_header import read_header

    header = read_header(q8_checked["path"])
    assert header.tensor_type_names() == {"Q8_0", "F32"}
    assert all(t.type == 0 for t in header.tensors if len(t.shape) == 1 or t.shape[1] == 1)
    check = q8_checked["check"]
    assert check["source"]["chunks"] == check["result"]["chunks"] == 2
    assert 5 < check["source"]["perplexity"] < 60          # a working model, not noise
    assert abs(check["delta_pct"]) < 1.0, check
    assert check["result"]["size"] < 0.6 * check["source"]["size"]


def test_eval_perplexity_cli_matches_library(q8_checked):
    r = invoke("eval", "perplexity", q8_checked["path"], "--chunks", "2", "--threads", "2", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["chunks"] == 2 and data["ctx"] == 512 and data["tokens_scored"] == 2 * 255
    assert data["perplexity"] == pytest.approx(q8_checked["check"]["result"]["perplexity"], rel=1e-4)


def test_perplexity_rejects_short_text(tmp_path, q8_checked):
    short = tmp_path / "short.txt"
    short.write_text("Too short to fill two windows.")
    msg = one_line_error(invoke("eval", "perplexity", q8_checked["path"], "--file", short))
    assert "needs at least 1024" in msg


def test_llmctl_run_on_every_result(q4_from_repo, q8_checked, f16_gguf):
    for path in (q4_from_repo["path"], q4_from_repo["intermediate"], q8_checked["path"]):
        r = invoke("run", path, "Name a colour.", "--max-tokens", "8", "--temperature", "0",
                   "--threads", "2", "--json")
        assert r.exit_code == 0, r.output
        data = json.loads(r.stdout)
        assert data["completion_tokens"] > 0 and data["text"].strip()


def test_requantize_refused_then_allowed_with_warning(tmp_path, model_path):
    out = tmp_path / "re.gguf"
    msg = one_line_error(invoke("quantize", "smollm2", "--bits", "8", "-o", out))
    assert "already quantized" in msg and "--allow-requantize" in msg
    assert list(tmp_path.iterdir()) == []
    r = invoke("quantize", "smollm2", "--bits", "8", "-o", out, "--allow-requantize",
               "--threads", "2")
    assert r.exit_code == 0, r.output
    assert "warning: requantizing" in r.stderr
    assert "smollm2:q8_0" in r.stdout and "->" in r.stdout
    r = invoke("run", out, "Hi", "--max-tokens", "4", "--temperature", "0", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["completion_tokens"] > 0


def _bad_hf_dir(root: Path, hf_dir: Path, arch: str = "LlamaForCausalLM") -> Path:
    d = root / f"bad-{arch}"
    d.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf_dir / name, d / name)
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["architectures"] = [arch]
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_bad_inputs_fail_cleanly(tmp_path, f16_gguf, hf_dir, monkeypatch):
    from safetensors.numpy import save_file

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "x.gguf"
    assert "not found" in one_line_error(invoke("quantize", tmp_path / "missing.gguf",
                                                "--bits", "4", "-o", out))
    junk = tmp_path / "junk.gguf"
    junk.write_text("not a model")
    assert "not a GGUF" in one_line_error(invoke("quantize", junk, "--bits", "4", "-o", out))
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(f16_gguf.read_bytes()[:4096])
    assert "corrupt" in one_line_error(invoke("quantize", truncated, "--bits", "4", "-o", out))
    assert "no config.json" in one_line_error(invoke("quantize", tmp_path, "--bits", "4", "-o", out))
    gpt2 = _bad_hf_dir(tmp_path, hf_dir, "GPT2LMHeadModel")
    msg = one_line_error(invoke("quantize", gpt2, "--bits", "4", "-o", out))
    assert "GPT2LMHeadModel" in msg and "LlamaForCausalLM" in msg and "Qwen2ForCausalLM" in msg
    int8 = _bad_hf_dir(tmp_path, hf_dir)
    save_file({"model.embed_tokens.weight": np.zeros((8, 4), np.int8)}, str(int8 / "model.safetensors"))
    assert "dtype I8" in one_line_error(invoke("quantize", int8, "--bits", "4", "-o", out))
    msg = one_line_error(invoke("quantize", f16_gguf, "--type", "Q3_X", "-o", out))
    assert "unknown quantization type" in msg and "Q4_K_M" in msg
    assert "--bits must be 4 or 8" in one_line_error(invoke("quantize", f16_gguf, "--bits", "5"))
    # A quantization llama.cpp itself rejects (needs an imatrix) leaves nothing.
    assert "imatrix" in one_line_error(invoke("quantize", f16_gguf, "--type", "IQ2_XXS", "-o", out,
                                              "--threads", "2"))
    assert list(out_dir.iterdir()) == []
    out.write_text("precious")
    assert "--force" in one_line_error(invoke("quantize", f16_gguf, "--bits", "8", "-o", out))
    assert out.read_text() == "precious"
    import llmctl.files

    monkeypatch.setattr(llmctl.files, "free_bytes", lambda where: 1 << 20)
    r = invoke("quantize", f16_gguf, "--bits", "8", "-o", out, "--force")
    assert r.exit_code == 7 and "not enough disk space" in one_line_error(r)
    r = invoke("quantize", hf_dir, "--bits", "8", "-o", out, "--force")
    assert r.exit_code == 7 and "not enough disk space" in one_line_error(r)
    assert sorted(p.name for p in out_dir.iterdir()) == ["x.gguf"] and out.read_text() == "precious"


def test_subprocess_errors_and_help(tmp_path, f16_gguf):
    env = {**os.environ, "NO_COLOR": "1"}
    p = subprocess.run([LLMCTL, "quantize", str(f16_gguf), "--type", "nope", "-o",
                        str(tmp_path / "o.gguf")], capture_output=True, text=True, env=env)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("error: unknown quantization type")
    assert not list(tmp_path.iterdir())
    for cmd in (["quantize", "--help"], ["eval", "perplexity", "--help"]):
        h = subprocess.run([LLMCTL, *cmd], capture_output=True, text=True, env=env)
        assert h.returncode == 0 and "Example: llmctl" in h.stdout and "--json" in h.stdout


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 128}


@pytest.mark.parametrize("arch,tokenizer,dtype,rope", [
    ("LlamaForCausalLM", "spm", "BF16", None),
    ("MistralForCausalLM", "spm", "F16", None),
    ("Qwen2ForCausalLM", "qwen2", "BF16", None),
    ("LlamaForCausalLM", "llama-bpe", "F32", LLAMA3_ROPE),
])
def test_tiny_architectures_convert_load_and_tokenize(tmp_path, arch, tokenizer, dtype, rope):
    from llama_cpp import Llama

    from llmctl.store.gguf_header import read_header

    src = tmp_path / f"tiny-{arch}"
    make_tiny_hf(src, arch, tokenizer, dtype, rope_scaling=rope)
    r = invoke("quantize", src, "--type", "Q8_0", "--keep-f16", "-o", tmp_path / "q8.gguf",
               "--threads", "2", "--json")
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)
    kept = Path(result["intermediate"])
    want = "BF16" if dtype == "BF16" else "F16"       # F32 sources are stored as F16
    assert kept.name.endswith(f"-{want}.gguf")
    header = read_header(kept)
    by_name = {t.name: t for t in header.tensors}
    types = header.tensor_type_names()
    assert types == {want, "F32"}, types
    assert all(t.type == 0 for t in header.tensors if len(t.shape) == 1)   # norms, biases F32
    assert header.metadata["general.architecture"] == ("qwen2" if arch.startswith("Qwen2") else "llama")
    assert header.metadata["tokenizer.ggml.pre"] == {"spm": "default"}.get(tokenizer, tokenizer)
    assert ("rope_freqs.weight" in by_name) == bool(rope)
    if arch.startswith("Qwen2"):
        assert "blk.0.attn_q.bias" in by_name
    for path in (kept, Path(result["path"])):
        llm = Llama(str(path), n_ctx=64, n_threads=2, verbose=False)
        if tokenizer == "spm":
            ids = llm.tokenize(b"hello world", add_bos=True)
            pieces = [llm._model.token_get_text(i) for i in ids]
            assert pieces == ["<s>", *SPM_WORDS], pieces
        else:
            ids = llm.tokenize(b"hello world<|im_end|>", add_bos=False, special=True)
            assert [llm.detokenize([i], special=True) for i in ids] == [b"hello", b" world", b"<|im_end|>"]
        # The graph builds and runs: hparams and tensor names/shapes are right.
        out = llm.create_completion("hello world", max_tokens=4, temperature=0.0)
        assert out["usage"]["completion_tokens"] >= 1
        del llm


def test_spm_parser_reads_types_scores_and_prefix_flag(tmp_path):
    from llmctl.quantize.hf_tokenizer import read_sentencepiece
    from quantize_helpers import write_sentencepiece

    names = write_sentencepiece(tmp_path / "tokenizer.model")
    pieces, scores, types, add_prefix = read_sentencepiece(tmp_path / "tokenizer.model")
    assert pieces == names and add_prefix is True
    assert types[:4] == [2, 3, 3, 6] and scores[pieces.index("▁hello")] == 6.0
    (tmp_path / "bad.model").write_bytes(b"\x0a\xff\xff")
    from llmctl.errors import BadModelFile

    with pytest.raises(BadModelFile):
        read_sentencepiece(tmp_path / "bad.model")


def test_default_text_is_shipped_and_long_enough():
    from llmctl.quantize.evaltext import default_text_path, load_text

    text = load_text()
    assert default_text_path().is_file() and len(text.split()) > 3000

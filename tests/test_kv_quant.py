"""KV-cache quantization (--kv-type f16|q8_0|q4_0) with the real default
model: the options' checks, llama.cpp's own allocation against the
planner, generation with quantized caches, the disk prefix cache's key and
`llmctl show`."""

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import smollm2_file
from llmctl.cli.app import app
from llmctl.errors import LlmctlError, UsageError
from llmctl.runtime.llama import ContextConfig, LlamaContext, LlamaModel
from llmctl.runtime.load_options import LoadOptions
from llmctl.runtime.planner import ModelShape
from llmctl.runtime.sampling import SamplingParams
from llmctl.store.gguf_info import read_gguf_info
from llmctl.store.resolve import ResolvedModel

QUANTIZED = ("q8_0", "q4_0")
# llama.cpp reports the KV size in MiB with two decimals.
LOG_ROUNDING = 0.005 * (1 << 20)
LONG = " ".join(f"Entry {i}: the archive holds {i * 11} maps of the coast." for i in range(20))


@pytest.fixture(scope="module")
def model():
    with_model = LlamaModel(smollm2_file())
    yield with_model
    with_model.close()


def load(home: Path, **opts):
    from llmctl.runtime.llm import LLM

    os.environ["LLMCTL_HOME"] = str(home)
    base = dict(ctx_size=512, max_num_seqs=2, max_num_batched_tokens=256, threads=1)
    return LLM(ResolvedModel("smollm2", smollm2_file(), context=512), LoadOptions(**{**base, **opts}))


def test_unknown_kv_type_is_a_usage_error_naming_the_choices():
    with pytest.raises(UsageError, match="'q5_1': use one of f16, q8_0, q4_0"):
        LoadOptions(kv_type="q5_1")


@pytest.mark.parametrize("kv", QUANTIZED)
def test_quantized_v_with_flash_attention_off_says_why(kv):
    with pytest.raises(UsageError, match="a quantized V cache needs flash attention; "
                                         "use --flash-attn on or auto"):
        LoadOptions(kv_type=kv, flash_attn=False)


def test_auto_flash_attention_is_on_unless_turned_off():
    assert LoadOptions(kv_type="q8_0").use_flash_attn          # a quantized V needs it
    assert LoadOptions().use_flash_attn                        # f16, prefix cache on
    assert not LoadOptions(flash_attn=False).use_flash_attn


def test_llama_cpp_refusing_the_context_is_an_error_with_its_reason(model):
    # Past LoadOptions (the perplexity tool builds contexts directly).
    with pytest.raises(LlmctlError, match="quantized V cache requires flash_attn"):
        LlamaContext(model, ContextConfig(n_ctx_seq=256, n_seq_max=1, n_batch=64, n_threads=1,
                                          flash_attn=False, kv_type="q8_0"))


@pytest.mark.parametrize("kv", ["f16", *QUANTIZED])
def test_llama_cpp_allocates_what_the_planner_estimates(model, kv):
    ctx = LlamaContext(model, ContextConfig(n_ctx_seq=1024, n_seq_max=2, n_batch=64, n_threads=1,
                                            kv_type=kv))
    try:
        planned = ModelShape.from_info(read_gguf_info(smollm2_file()), kv).kv_bytes(2 * 1024)
        assert ctx.kv_bytes == pytest.approx(planned, abs=LOG_ROUNDING)
    finally:
        ctx.close()


@pytest.mark.parametrize("kv", QUANTIZED)
def test_quantized_cache_loads_and_generates(tmp_path, kv):
    with load(tmp_path, kv_type=kv, prefix_cache=False) as llm:
        # The engine's context really holds the type: its size is the type's.
        info = read_gguf_info(smollm2_file())
        planned = ModelShape.from_info(info, kv).kv_bytes(llm.n_ctx * 2)
        assert llm.engine.ctx.kv_bytes == pytest.approx(planned, abs=LOG_ROUNDING)
        assert llm.engine.ctx.kv_bytes < info.kv_cache_bytes(llm.n_ctx * 2, "f16") * 0.6
        c = llm.complete(llm.chat_tokens([{"role": "user", "content": "Name a colour."}]),
                         SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
        assert c.usage.completion_tokens == 12 and c.text.strip()


def test_disk_prefix_cache_keys_on_the_kv_type(tmp_path):
    # Flash attention on for both, so that only the KV type tells them apart.
    with load(tmp_path, flash_attn=True) as f16:
        f16.complete(f16.text_tokens(LONG + " Count the maps."), SamplingParams(temperature=0, max_tokens=4))
        f16.prefix_cache.disk.flush()
        f16_ns = f16.prefix_cache.disk.ns
    for attempt in range(2):
        with load(tmp_path, kv_type="q8_0") as q8:
            assert q8.prefix_cache.disk.ns != f16_ns
            c = q8.complete(q8.text_tokens(LONG + " List the maps."),
                            SamplingParams(temperature=0, max_tokens=4))
            q8.prefix_cache.disk.flush()
            if attempt == 0:    # the f16 entry is no hit for q8_0...
                assert c.usage.cached_tokens == 0
            else:               # ...but q8_0's own entry is, after a reload
                assert c.usage.cached_tokens >= 256
                assert q8.stats().cached_tokens_disk == c.usage.cached_tokens
    assert sorted(p.name for p in (tmp_path / "cache" / "prefix").iterdir()) == sorted(
        [f16_ns, q8.prefix_cache.disk.ns])


def test_show_reports_the_memory_of_the_chosen_type():
    runner = CliRunner()
    shown = {}
    for kv in ("f16", "q8_0", "q4_0"):
        r = runner.invoke(app, ["show", "smollm2", "--ctx-size", "4096", "--kv-type", kv, "--json"])
        assert r.exit_code == 0, r.output
        shown[kv] = json.loads(r.stdout)["memory"]
        assert shown[kv]["kv_type"] == kv
        assert shown[kv]["total_bytes"] == shown[kv]["weights_bytes"] + shown[kv]["kv_cache_bytes"]
    f16 = shown["f16"]["kv_cache_bytes"]
    assert shown["q8_0"]["kv_cache_bytes"] == f16 * 34 // 64
    assert shown["q4_0"]["kv_cache_bytes"] == f16 * 18 // 64
    text = runner.invoke(app, ["show", "smollm2", "--ctx-size", "4096", "--kv-type", "q8_0"]).stdout
    assert "q8_0" in text and "KV cache 50.1 MB" in text
    bad = runner.invoke(app, ["show", "smollm2", "--kv-type", "q5_1"])
    assert bad.exit_code == 2 and "q8_0" in bad.output


def test_cli_flags_reach_the_load_options(monkeypatch):
    runner = CliRunner()
    # serve checks its options before it imports the server stack or a model.
    monkeypatch.setenv("LLMCTL_KV_TYPE", "q4_0")
    r = runner.invoke(app, ["serve", "smollm2", "--flash-attn", "off"])
    assert r.exit_code == 2 and "a quantized V cache needs flash attention" in r.output
    r = runner.invoke(app, ["run", "smollm2", "Hi", "--kv-type", "q8_0", "--temperature", "0",
                            "--max-tokens", "4", "--ctx-size", "128", "--threads", "1", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["completion_tokens"] >= 1

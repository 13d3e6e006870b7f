"""--n-gpu-layers auto with simulated GPUs and model sizes."""

from dataclasses import replace

import pytest

from llmctl.runtime.planner import ModelShape, kv_slots, parse_gpu_layers, plan_gpu_layers

GIB = 1 << 30
# Llama-2-7B-like at 16 bits: ~14 GB, 32 layers, 32 KV heads.
LLAMA7B_F16 = ModelShape(weights_bytes=int(13.5 * GIB), n_layers=32, n_embd=4096, n_head=32, n_head_kv=32)
# Llama-3-70B-like at 4 bits: ~35 GB (the example), 80 layers, GQA with 8 KV heads.
LLAMA70B_Q4 = ModelShape(weights_bytes=35 * GIB, n_layers=80, n_embd=8192, n_head=64, n_head_kv=8)
# The same with an f16, q8_0 and q4_0 KV cache.
KV_SHAPES = [replace(LLAMA70B_Q4, kv_bytes_per_elem=b) for b in (2.0, 34 / 32, 18 / 32)]


def test_no_gpu_or_cpu_build_means_zero():
    assert plan_gpu_layers(LLAMA7B_F16, [], 4096, gpu_capable=True) == 0
    assert plan_gpu_layers(LLAMA7B_F16, [80 * GIB], 4096, gpu_capable=False) == 0


def test_7b_f16_fits_entirely_on_an_80gb_gpu():
    assert plan_gpu_layers(LLAMA7B_F16, [80 * GIB], 4096, True) == 33


def test_7b_f16_partially_on_an_8gb_gpu():
    n = plan_gpu_layers(LLAMA7B_F16, [8 * GIB], 4096, True)
    assert 10 <= n < 32
    per_layer = LLAMA7B_F16.layer_bytes() + LLAMA7B_F16.kv_bytes_per_layer(4096)
    assert n * per_layer <= 8 * GIB * 0.92 - 1024 * (1 << 20)


def test_70b_q4_fits_on_h100_but_not_on_24gb():
    assert plan_gpu_layers(LLAMA70B_Q4, [80 * GIB], 8192, True) == 81
    partial = plan_gpu_layers(LLAMA70B_Q4, [24 * GIB], 8192, True)
    assert 30 <= partial < 80


def test_two_gpus_pool_their_memory():
    one = plan_gpu_layers(LLAMA70B_Q4, [24 * GIB], 8192, True)
    two = plan_gpu_layers(LLAMA70B_Q4, [24 * GIB, 24 * GIB], 8192, True)
    assert two > one


def test_long_context_leaves_fewer_layers():
    short = plan_gpu_layers(LLAMA7B_F16, [12 * GIB], 2048, True)
    long = plan_gpu_layers(LLAMA7B_F16, [12 * GIB], 32768, True)
    assert long < short


@pytest.mark.parametrize("value,expected", [("auto", None), ("AUTO", None), ("0", 0), (12, 12), ("-1", -1)])
def test_parse(value, expected):
    assert parse_gpu_layers(value) == expected


@pytest.mark.parametrize("value", ["lots", "-2", "1.5"])
def test_parse_rejects(value):
    with pytest.raises(ValueError):
        parse_gpu_layers(value)


def test_planner_and_show_agree_on_the_kv_cache(model_path):
    from llmctl.store.gguf_info import read_gguf_info

    info = read_gguf_info(model_path)
    shape = ModelShape(info.size, info.n_layers, info.n_embd, info.n_head, info.n_head_kv,
                       head_dim=info.head_dim)
    assert shape.kv_bytes_per_layer(4096) * info.n_layers == info.kv_cache_bytes(4096) > 0
    for kv in ("f16", "q8_0", "q4_0"):
        assert ModelShape.from_info(info, kv).kv_bytes(4096) == info.kv_cache_bytes(4096, kv)


def test_quantized_kv_shrinks_the_cache_by_its_block_size():
    f16, q8, q4 = KV_SHAPES
    # 80 layers x 8 KV heads x 128 dims x K and V x 2 bytes: 320 KiB per token at f16.
    assert f16.kv_bytes(4096) == 80 * 8 * 128 * 2 * 2 * 4096 == 1280 * (1 << 20)
    assert q8.kv_bytes(4096) == f16.kv_bytes(4096) * 34 // 64
    assert q4.kv_bytes(4096) == f16.kv_bytes(4096) * 18 // 64


def test_quantized_kv_fits_more_slots_and_more_layers():
    f16, q8, q4 = KV_SHAPES
    # 1.25 GiB per 4096-token slot at f16: 8 slots in 10 GiB, 15 at q8_0, 28 at q4_0.
    assert [kv_slots(s, 4096, 10 * GIB) for s in (f16, q8, q4)] == [8, 15, 28]
    assert kv_slots(f16, 4096, GIB) == 0
    layers = [plan_gpu_layers(s, [40 * GIB], 65536, True) for s in (f16, q8, q4)]
    assert layers[0] < layers[1] < layers[2]

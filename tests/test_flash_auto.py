"""`--flash-attn auto` with the prefix cache on (runtime/flash_auto.py):
off only where this CPU measures rows exact with it off, the measurement
stored across processes, and every explicit or unmeasured case left to the
static rule. The suite runs on CPUs of both kinds, so each test states the
outcome in terms of the machine's own measurement."""

from __future__ import annotations

import json

import pytest

from conftest import smollm2_file
from llmctl.runtime.config import LoadOptions
from llmctl.runtime.flash_auto import STORE_NAME, resolve_flash_attn
from llmctl.runtime.llama import LlamaModel
from llmctl.runtime.llama import exactness as ex


@pytest.fixture(scope="module")
def model():
    m = LlamaModel(smollm2_file())
    yield m
    m.close()


@pytest.fixture
def fresh(monkeypatch):
    # The process-wide cache would answer before the store is read.
    monkeypatch.setattr(ex, "_cache", {})


def test_auto_is_off_exactly_where_rows_measure_exact(model, tmp_path, fresh):
    opts, why = resolve_flash_attn(LoadOptions(), model, 2, 0, tmp_path)
    off_exact = ex.measure_rows(smollm2_file(), threads=2).exact
    assert opts.flash_attn is opts.use_flash_attn is (not off_exact)
    assert why.startswith("off: " if off_exact else "on: ")
    stored = json.loads((tmp_path / STORE_NAME).read_text())["entries"]
    assert [e["exact"] for e in stored.values()] == [off_exact]
    assert [e["flash_attn"] for e in stored.values()] == [False]


def test_a_stored_measurement_is_used_without_measuring_again(model, tmp_path, fresh):
    resolve_flash_attn(LoadOptions(), model, 2, 0, tmp_path)
    store = tmp_path / STORE_NAME
    data = json.loads(store.read_text())
    (entry,) = data["entries"].values()
    # Flip it: a later process must read the store, not the kernels.
    entry.update(exact=not entry["exact"], max_logit_diff=0.0 if not entry["exact"] else 0.5)
    store.write_text(json.dumps(data))
    ex._cache.clear()
    opts, _ = resolve_flash_attn(LoadOptions(), model, 2, 0, tmp_path)
    assert opts.flash_attn is (not entry["exact"])


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", '{"entries": {"x": 1}}',
                                    '{"entries": []}'])
def test_a_damaged_store_is_measured_over(model, tmp_path, fresh, damage):
    store = tmp_path / STORE_NAME
    store.write_text(damage)
    opts, _ = resolve_flash_attn(LoadOptions(), model, 2, 0, tmp_path)
    assert opts.flash_attn is (not ex.measure_rows(smollm2_file(), threads=2).exact)
    assert len(json.loads(store.read_text())["entries"]) >= 1


def test_an_entry_of_another_shape_is_measured_over(model, tmp_path, fresh):
    resolve_flash_attn(LoadOptions(), model, 2, 0, tmp_path)
    store = tmp_path / STORE_NAME
    data = json.loads(store.read_text())
    for entry in data["entries"].values():
        entry["from_a_later_version"] = True
    store.write_text(json.dumps(data))
    ex._cache.clear()
    got = ex.measure_rows(smollm2_file(), threads=2, model=model, store=store)
    assert got.model == smollm2_file().name


def test_the_store_keeps_a_bounded_number_of_entries(model, tmp_path, fresh, monkeypatch):
    monkeypatch.setattr(ex, "MAX_STORED", 2)
    store = tmp_path / STORE_NAME
    for threads in (1, 2, 3):
        ex.measure_rows(smollm2_file(), threads=threads, model=model, store=store)
    kept = json.loads(store.read_text())["entries"].values()
    assert sorted(e["threads"] for e in kept) == [2, 3]


@pytest.mark.parametrize("opts,gpu_layers,expected", [
    (LoadOptions(flash_attn=True), 0, True),              # asked for: never measured
    (LoadOptions(flash_attn=False), 0, False),
    (LoadOptions(prefix_cache=False), 0, True),           # no cache: the faster one
    (LoadOptions(kv_type="q8_0"), 0, True),               # a quantized V needs it
    (LoadOptions(), 8, False),                            # a GPU's kernels are not measured
])
def test_settled_cases_are_not_measured(model, tmp_path, fresh, opts, gpu_layers, expected):
    got, why = resolve_flash_attn(opts, model, 2, gpu_layers, tmp_path)
    assert got.use_flash_attn is expected and why in ("set", "auto")
    assert not (tmp_path / STORE_NAME).exists()

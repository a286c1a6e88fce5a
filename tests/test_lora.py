"""LoRA adapters without model weights: reading, checks, the layer-trimmed copy for early exit,
the memory budget and the command-line options (tests/lora_real.py loads them into llama.cpp)."""
from __future__ import annotations

import argparse

import gguf
import numpy as np
import pytest

from app.settings import lora_list
from loading.adapters import adapter_for_layers, check_adapters, read_adapter
from models.gguf_info import read_info
from loading.plan import budget_settings
from engine.errors import IncompatiblePairError, ModelFileError, SettingsError
from models.budget import estimate_pair, require_fits
from engine.backend import ModelConfig
from tests import tinygguf
from bench.fakes.lora_adapter import write_lora


@pytest.fixture
def model(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "store"))
    return tinygguf.write(tmp_path / "tiny.gguf", arch="qwen2", n_layer=3, n_embd=16)


def test_an_adapter_reads_back_as_written(model, tmp_path):
    path = write_lora(model, tmp_path / "a.gguf", layers=[0, 2], rank=4, matrices=("attn_q",))
    info = read_adapter(path)
    assert (info.architecture, info.rank, info.alpha) == ("qwen2", 4, 4.0)
    assert info.layers == (0, 2)
    assert info.targets == ("blk.0.attn_q.weight", "blk.2.attn_q.weight")
    assert info.n_bytes == 2 * 2 * 4 * 16 * 4
    r = gguf.GGUFReader(str(path))
    shapes = {t.name: [int(n) for n in t.shape] for t in r.tensors}
    # llama.cpp's layout: lora_a is [in, rank], lora_b [rank, out] (ggml order).
    assert shapes["blk.0.attn_q.weight.lora_a"] == [16, 4]
    assert shapes["blk.0.attn_q.weight.lora_b"] == [4, 16]
    check_adapters(read_info(model), [(str(path), 1.0)])


def test_adapters_made_for_another_model_are_refused(model, tmp_path):
    other = write_lora(model, tmp_path / "llama.gguf", layers=[0], matrices=("attn_q",),
                       arch="llama")
    with pytest.raises(IncompatiblePairError, match="is for llama"):
        check_adapters(read_info(model), [(str(other), 1.0)])
    deep_model = tinygguf.write(tmp_path / "deep.gguf", arch="qwen2", n_layer=6, n_embd=16)
    deep = write_lora(deep_model, tmp_path / "deep-a.gguf", layers=[5], matrices=("attn_q",))
    with pytest.raises(IncompatiblePairError, match="layer 5"):
        check_adapters(read_info(model), [(str(deep), 1.0)])
    with pytest.raises(SettingsError, match="scale"):
        check_adapters(read_info(model), [(str(other), 1e6)])


def test_files_that_are_not_lora_adapters_are_refused(model, tmp_path):
    with pytest.raises(ModelFileError, match="not a LoRA adapter"):
        read_adapter(model)
    with pytest.raises(ModelFileError, match="not found"):
        read_adapter(tmp_path / "missing.gguf")
    w = gguf.GGUFWriter(str(tmp_path / "f64.gguf"), "qwen2")
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_tensor("blk.0.attn_q.weight.lora_a", np.zeros((4, 16)))
    w.add_tensor("blk.0.attn_q.weight.lora_b", np.zeros((16, 4)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # llama.cpp accepts F64 tensors and crashes at the first decode.
    with pytest.raises(ModelFileError, match="F64"):
        read_adapter(tmp_path / "f64.gguf")


def test_early_exit_gets_the_adapter_without_its_deeper_layers(model, tmp_path):
    path = write_lora(model, tmp_path / "a.gguf", layers=[0, 2], rank=4, matrices=("attn_q",))
    assert adapter_for_layers(path, 3) == path
    cut = adapter_for_layers(path, 2)
    assert cut != path and cut.parent.name == "derived"
    assert read_adapter(cut).layers == (0,)
    a = {t.name: np.array(t.data) for t in gguf.GGUFReader(str(path)).tensors}
    b = {t.name: np.array(t.data) for t in gguf.GGUFReader(str(cut)).tensors}
    assert set(b) == {"blk.0.attn_q.weight.lora_a", "blk.0.attn_q.weight.lora_b"}
    assert all(np.array_equal(a[k], b[k]) for k in b)
    # Built once: the second call returns the same file without writing it again.
    mtime = cut.stat().st_mtime_ns
    assert adapter_for_layers(path, 2) == cut and cut.stat().st_mtime_ns == mtime


def test_the_budget_counts_the_adapters(model, tmp_path):
    path = write_lora(model, tmp_path / "a.gguf", layers=[0, 1, 2], rank=8, matrices=("attn_q",))
    plain = estimate_pair(model, None, n_ctx=256)
    more = estimate_pair(model, None, n_ctx=256, adapter_bytes=(1000, 0))
    assert more.target.weights_cpu == plain.target.weights_cpu + 1000
    cfg = ModelConfig(str(model), n_ctx=256, lora=((str(path), 1.0),))
    with_lora = require_fits(cfg.path, None, **budget_settings(cfg, None))
    assert with_lora.target.weights_cpu == plain.target.weights_cpu + path.stat().st_size


def test_command_line_adapters():
    args = argparse.Namespace(lora=["a.gguf", "b.gguf"], lora_scale=0.5, draft_lora=[],
                              draft_lora_scale=1.0)
    assert lora_list(args) == (("a.gguf", 0.5), ("b.gguf", 0.5))
    assert lora_list(args, "draft_") == ()
    assert lora_list(argparse.Namespace()) == ()

"""The requantized draft: when `auto` derives it, llama.cpp's quantizer on tiny files, reuse and
rebuild by SHA-256, bad input, and load_pair handing the derived file to the loader."""
from __future__ import annotations

import os

import gguf
import pytest

from engine.backend import ModelConfig
from engine.errors import ModelFileError, SettingsError
from engine.events import DoneEvent
from engine.generation_config import GenerationConfig
from engine.rng import Rng
from engine.sampling import SamplingParams
from loading.derived.files import file_sha256
from loading.derived.quantized import bits_per_weight, derive_quantized, resolve
from models.gguf_info import read_info
from loading.options import LoadOptions
from loading.load import load_pair
from tests import tinygguf
from bench.fakes.backend import FakeBackend

# Q4_0 packs rows in blocks of 32 weights: tiny models for the real quantizer need n_embd % 32 == 0.
TINY = dict(n_layer=2, n_embd=64, n_head=4, n_head_kv=2)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "store"))
    return tmp_path / "store"


def tensor_types(path):
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


def test_auto_requantizes_only_a_heavy_draft_on_the_cpu(tmp_path, store):
    heavy = read_info(tinygguf.write(tmp_path / "f32.gguf", **TINY))
    assert bits_per_weight(heavy) == pytest.approx(32.0)
    assert resolve("auto", heavy, gpu_layers=0) == "q4_0"
    assert resolve("auto", heavy, gpu_layers=99) is None
    assert resolve("off", heavy, gpu_layers=0) is None
    assert resolve("q4_0", heavy, gpu_layers=99) == "q4_0"
    light = read_info(derive_quantized(heavy.path, "q4_0"))
    assert bits_per_weight(light) == pytest.approx(4.5)
    assert resolve("auto", light, gpu_layers=0) is None
    with pytest.raises(SettingsError, match="unknown draft quantization"):
        resolve("q2", heavy, gpu_layers=0)


def test_llama_cpp_quantizes_every_tensor_to_q4_0_in_the_store(tmp_path, store):
    source = tinygguf.write(tmp_path / "tiny.gguf", **TINY)
    out = derive_quantized(source, "q4_0")
    assert out.parent == store / "derived" and file_sha256(source)[:16] in out.name
    assert set(tensor_types(out).values()) == {"Q4_0"}
    assert set(tensor_types(source).values()) == {"F32"}
    # The tokenizer and template travel with the weights.
    reader, orig = gguf.GGUFReader(str(out)), gguf.GGUFReader(str(source))
    assert reader.fields["tokenizer.ggml.tokens"].contents() == orig.fields["tokenizer.ggml.tokens"].contents()
    assert reader.fields["tokenizer.chat_template"].contents() == tinygguf.TEMPLATE
    assert not list((store / "derived").glob("*.part"))


def test_the_derived_file_is_reused_until_the_source_changes(tmp_path, store):
    source = tinygguf.write(tmp_path / "tiny.gguf", **TINY)
    calls = []

    def counting(src, dst, kind):
        from engine.llama.quantize import quantize
        calls.append(kind)
        quantize(src, dst, kind)

    first = derive_quantized(source, "q4_0", counting)
    assert derive_quantized(source, "q4_0", counting) == first and calls == ["q4_0"]
    stamp = source.stat().st_mtime_ns
    tinygguf.write(source, **{**TINY, "n_layer": 3})
    os.utime(source, ns=(stamp + 10**9, stamp + 10**9))
    second = derive_quantized(source, "q4_0", counting)
    assert second != first and not first.exists() and calls == ["q4_0", "q4_0"]
    assert sum(1 for name in tensor_types(second) if name.startswith("blk.")) == 3


def test_a_file_llama_cpp_cannot_quantize_is_a_clear_error_and_leaves_nothing(tmp_path, store):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(ModelFileError, match="could not quantize bad.gguf"):
        derive_quantized(bad, "q4_0")
    with pytest.raises(ModelFileError, match="not found"):
        derive_quantized(tmp_path / "missing.gguf", "q4_0")
    assert not list((store / "derived").glob("*.gguf")) and not list((store / "derived").glob("*.part"))


def test_pair_load_gives_the_loader_the_derived_draft_unless_off(tmp_path, store):
    target = tinygguf.write(tmp_path / "target.gguf", **TINY)
    draft = tinygguf.write(tmp_path / "draft.gguf", **TINY)
    for choice, expect in (("auto", derive_quantized(draft, "q4_0")), ("off", draft)):
        loaded = []

        def loader(cfg):
            loaded.append(cfg.path)
            return FakeBackend(order=1, n_vocab=16)

        pair = load_pair(ModelConfig(str(target)), ModelConfig(str(draft)),
                         LoadOptions(check_budget=False, draft_quant=choice), loader=loader)
        assert loaded == [str(target), str(expect)] and pair.draft_path == str(expect)
        done = [ev for ev in pair.generate("abcab", GenerationConfig(
            params=SamplingParams(temperature=0.0), gamma=3, max_tokens=8), raw=True)][-1]
        assert isinstance(done, DoneEvent) and len(done.tokens) == 8
        pair.close()


@pytest.mark.long
@pytest.mark.real
def test_the_embedded_draft_requantized_still_drafts_the_targets_tokens(embedded_paths):
    from engine.drafters.draft_model import DraftModelDrafter
    from engine.llama.backend import load

    path = derive_quantized(embedded_paths[1], "q4_0")
    assert bits_per_weight(read_info(path)) == pytest.approx(4.5)
    assert bits_per_weight(read_info(embedded_paths[1])) > 6.0
    backend = load(ModelConfig(str(path), n_ctx=128, n_threads=2))
    try:
        context = backend.tokenize("def add(a, b):\n    return", True, True)
        p = DraftModelDrafter(backend).draft(context, 3, SamplingParams(temperature=0.0),
                                               Rng(0))
        # The full-precision draft and the target both continue with " a + b".
        assert backend.tokenize(" a + b", False, False) == p.tokens.tolist()
    finally:
        backend.close()


@pytest.mark.parametrize("kind", ["q4_0", "q8_0"])
def test_the_plan_sizes_a_requantized_draft_as_llama_cpp_writes_it(tmp_path, store, kind):
    from loading.derived.quantized import planned_info
    from models.budget import Layout
    source = read_info(tinygguf.write(tmp_path / "f32.gguf", **TINY))
    planned = Layout.from_info(planned_info(source, kind))
    written = Layout.from_info(read_info(derive_quantized(source.path, kind)))
    assert planned.layer_bytes == written.layer_bytes
    assert (planned.output_bytes, planned.other_bytes) == (written.output_bytes,
                                                            written.other_bytes)


def test_a_requantized_draft_is_placed_from_its_own_bytes_not_its_sources(tmp_path, store):
    from loading.plan import plan_load
    from models.machine import Machine
    gib = 1 << 30
    card = Machine(64 * gib, 60 * gib, "Test GPU", 8 * gib, 8 * gib)
    t = str(tinygguf.write(tmp_path / "t.gguf", **TINY))
    d = str(tinygguf.write(tmp_path / "d.gguf", **TINY))
    given = plan_load(ModelConfig(t, n_ctx=256), ModelConfig(d, n_ctx=256),
                      LoadOptions(draft_quant="off"), machine=card)
    q4 = plan_load(ModelConfig(t, n_ctx=256), ModelConfig(d, n_ctx=256),
                   LoadOptions(draft_quant="q4_0"), machine=card)
    assert q4.draft_quant == "q4_0" and q4.draft_info == given.draft_info
    # F32 at 32 bits a weight against Q4_0's 4.5: the draft's GPU weights shrink as much.
    f32_bytes = given.offload.placement("draft").weights
    assert q4.offload.placement("draft").weights * 6 < f32_bytes


def test_tune_plans_each_derived_draft_in_the_room_the_pair_left(tmp_path, store):
    from bench.tuning.host import PairHost
    from engine.pair import Pair
    from loading.plan import plan_load
    from models.candidate import Candidate
    from models.machine import GPU_MARGIN, Machine
    gib = 1 << 30
    t = str(tinygguf.write(tmp_path / "t.gguf", **TINY))
    d = str(tinygguf.write(tmp_path / "d.gguf", **TINY))

    def variant_layers(free: int) -> tuple[int, int]:
        card = Machine(64 * gib, 60 * gib, "Test GPU", free, free)
        plan = plan_load(ModelConfig(t, n_ctx=256), ModelConfig(d, n_ctx=256),
                         LoadOptions(draft_quant="off"), machine=card)
        loaded: list[ModelConfig] = []

        def loader(config: ModelConfig) -> FakeBackend:
            loaded.append(config)
            return FakeBackend(eog=59)
        pair = Pair(FakeBackend(eog=59), FakeBackend(eog=59))
        host = PairHost(pair, plan.target, plan.draft, max_tokens=4, loader=loader, plan=plan)
        host._add_variant(Candidate("draft", draft_quant="q4_0"))
        assert loaded[0].path != d and loaded[0].n_ctx == 256
        return plan.draft.n_gpu_layers, loaded[0].n_gpu_layers

    # Room to spare: the Q4_0 variant goes whole beside the pair.
    assert variant_layers(8 * gib) == (TINY["n_layer"] + 1, TINY["n_layer"] + 1)
    # The pair fills the card to its margin: the variant, planned from its own file, gets
    # what is left (none here), not the draft's layers.
    used = plan_load(ModelConfig(t, n_ctx=256), ModelConfig(d, n_ctx=256),
                     LoadOptions(draft_quant="off"),
                     machine=Machine(64 * gib, 60 * gib, "Test GPU", 8 * gib, 8 * gib)).offload.used
    draft_layers, variant = variant_layers(used + GPU_MARGIN + 1024)
    assert draft_layers == TINY["n_layer"] + 1 and variant == 0

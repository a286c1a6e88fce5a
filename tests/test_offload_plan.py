"""The offload plan against made-up devices: no GPU, 3, 6, 8 and 24 GiB cards, a 16 GiB Mac;
pairs shaped like Qwen2.5 7B, 14B and 0.5B, and the embedded pair; a context long enough for the
KV cache to decide. Nothing loads: the plan is data from headers (or layouts) and a `Machine`."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path
from unittest import mock

import pytest

from app.cli import main as cli_main
from app.runtime.holder import PairHolder
from app.runtime.loader_settings import LoaderSettings
from app.ui import status_banner, wizard
from engine.llama import backend as llama_backend

from engine.backend import ModelConfig
from loading.options import LoadOptions
from loading.load import execute
from loading.plan import plan_load
from models.budget import Layout
from models.machine import GPU_MARGIN, Machine, parse_size, physical_cores, what_if
from models.offload import gpu_layers, plan_pair
from engine.errors import SettingsError
from tests import tinygguf
from bench.fakes.backend import FakeBackend

GIB = 1 << 30
HOST = Machine(64 * GIB, 60 * GIB)
NO_GPU = Machine(64 * GIB, 60 * GIB, gpu_note="this llama.cpp is built for the CPU only; "
                 "scripts/run builds llama.cpp for CUDA where nvcc is installed")


def card(gib: float, free: float | None = None) -> Machine:
    size = int(gib * GIB)
    return Machine(64 * GIB, 60 * GIB, f"Test GPU {gib:g} GiB",
                   int((free if free is not None else gib) * GIB), size)


def qwen(name: str, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int,
         file_bytes: int, n_vocab: int = 152064, tied: bool = False) -> Layout:
    """A Q4_K_M Qwen2.5 of these shapes: Q4_K token embeddings (4.5 bits), a Q6_K output
    matrix (6.56 bits; a tied one is the embeddings again) and the rest split over the blocks."""
    embd = n_vocab * n_embd * 9 // 16
    output = embd if tied else n_vocab * n_embd * 105 // 128
    per_layer = (file_bytes - embd - (0 if tied else output)) // n_layer
    return Layout(name, n_layer, n_embd, n_head, n_head_kv, head_dim, head_dim, n_vocab,
                  (per_layer,) * n_layer, (per_layer,) * n_layer, output, 0, embd, quant="Q4_K_M")


Q7B = qwen("qwen2.5-7b-q4_k_m", 28, 3584, 28, 4, 128, 4_683_073_952)
Q14B = qwen("qwen2.5-14b-q4_k_m", 48, 5120, 40, 8, 128, 8_988_110_976)
Q05B = qwen("qwen2.5-0.5b-q4_k_m", 24, 896, 14, 2, 64, 397_808_192, n_vocab=151936, tied=True)
# The embedded pair: Qwen2.5-Coder-1.5B Q4_K_M and the 0.5B as shipped (Q5_0/Q8_0, 6.2 bits).
EMB_T = qwen("coder-1.5b-q4_k_m", 28, 1536, 12, 2, 128, 1_117_320_768, n_vocab=151936, tied=True)
EMB_D = qwen("coder-0.5b-q5_0", 24, 896, 14, 2, 64, 491_400_064, n_vocab=151936, tied=True)


def whole(p, layout: Layout) -> bool:
    return p.placed == layout.n_layer and p.gpu_layers == layout.n_layer + 1


def partly(p, layout: Layout) -> bool:
    """Some layers on the GPU, not all (the output matrix counts: it goes last)."""
    return 0 < p.gpu_layers < layout.n_layer + 1


def test_no_gpu_places_nothing_and_says_why():
    report, plan = plan_pair(Q7B, Q05B, NO_GPU)
    assert report.target.gpu_layers == report.draft.gpu_layers == 0 and plan.used == 0
    line = plan.line()
    assert "target 0/28, draft 0/24 layers on a GPU" in line and "CPU only" in line
    assert "scripts/run" in line


def test_7b_and_05b_fit_whole_on_a_24_gib_card():
    report, plan = plan_pair(Q7B, Q05B, card(24))
    t, d = plan.placement("target"), plan.placement("draft")
    assert whole(t, Q7B) and whole(d, Q05B) and report.verdict == "fits"
    assert plan.used <= 24 * GIB - GPU_MARGIN
    assert plan.line().startswith("target 28/28 layers on Test GPU 24 GiB (")
    assert "draft 24/24 layers on GPU" in plan.line() and "1.0 GiB margin" in plan.line()


def test_7b_on_a_6_gib_card_puts_the_draft_whole_and_the_target_partly():
    report, plan = plan_pair(Q7B, Q05B, card(6))
    t, d = plan.placement("target"), plan.placement("draft")
    assert whole(d, Q05B) and partly(t, Q7B)
    assert plan.used <= 6 * GIB - GPU_MARGIN
    # One more target layer would not fit: the plan fills the card up to its margin.
    more, _ = plan_pair(Q7B, Q05B, card(6), gpu_layers=t.gpu_layers + 1,
                        draft_gpu_layers=d.gpu_layers)
    assert more.verdict == "fits with offload" and more.split == (t.gpu_layers, d.gpu_layers)


def test_14b_does_not_fit_whole_the_draft_goes_first():
    _, plan = plan_pair(Q14B, Q05B, card(8))
    t, d = plan.placement("target"), plan.placement("draft")
    assert whole(d, Q05B) and partly(t, Q14B) and t.placed < Q14B.n_layer
    assert f"target {t.placed}/48 layers" in plan.line() and "draft 24/24" in plan.line()


def test_the_embedded_pair_on_a_3_gib_card_and_on_an_8_gib_card():
    _, small = plan_pair(EMB_T, EMB_D, card(3))
    assert whole(small.placement("draft"), EMB_D)
    assert partly(small.placement("target"), EMB_T)
    _, eight = plan_pair(EMB_T, EMB_D, what_if(HOST, gpu_memory=parse_size("8GiB")))
    assert whole(eight.placement("target"), EMB_T) and whole(eight.placement("draft"), EMB_D)


def test_a_16_gib_mac_shares_its_memory():
    mac = what_if(HOST, unified_memory=16 * GIB)
    assert mac.unified and mac.ram_total == 16 * GIB and mac.gpu_free == 12 * GIB
    _, plan = plan_pair(Q7B, Q05B, mac)
    assert whole(plan.placement("target"), Q7B) and whole(plan.placement("draft"), Q05B)
    assert "(unified memory)" in plan.line()
    assert plan.used <= mac.gpu_room
    # An 8 GiB Mac lends Metal 6 GiB: the draft whole, the target partly.
    small = what_if(HOST, unified_memory=8 * GIB)
    report, plan = plan_pair(Q7B, Q05B, small)
    assert report.ok and plan.used <= small.gpu_room
    assert whole(plan.placement("draft"), Q05B) and partly(plan.placement("target"), Q7B)


def test_a_long_context_lets_the_kv_cache_decide():
    short_r, short = plan_pair(Q7B, Q05B, card(8), n_ctx=4096)
    long_r, long = plan_pair(Q7B, Q05B, card(8), n_ctx=32768)
    assert whole(short.placement("target"), Q7B)
    t = long.placement("target")
    assert partly(t, Q7B)
    # What crowds the layers out is the cache: eight times the bytes per layer (with flash
    # attention on the GPU no score matrix grows with it).
    s = short.placement("target")
    assert long_r.target.weights_gpu < short_r.target.weights_gpu
    assert t.kv * s.placed == 8 * s.kv * t.placed and t.compute == s.compute


def test_a_number_given_is_never_changed():
    report, plan = plan_pair(Q7B, Q05B, card(24), gpu_layers=10)
    # llama.cpp's -ngl 10: the output matrix and nine blocks.
    assert report.target.gpu_layers == 10 and plan.placement("target").placed == 9
    assert whole(plan.placement("draft"), Q05B)
    report, _ = plan_pair(Q7B, Q05B, card(6), draft_gpu_layers=0)
    assert report.draft.gpu_layers == 0 and report.target.gpu_layers > 0
    report, _ = plan_pair(Q7B, Q05B, card(24), gpu_layers=-1, draft_gpu_layers=-1)
    assert report.target.gpu_layers == 29 and report.draft.gpu_layers == 25


def test_lora_adapters_sit_beside_the_layers_they_adapt():
    adapter = 280 << 20
    plain, _ = plan_pair(Q7B, Q05B, card(24))
    adapted, plan = plan_pair(Q7B, Q05B, card(24), adapter_bytes=(adapter, 0))
    assert adapted.target.weights_gpu == plain.target.weights_gpu + adapter
    assert whole(plan.placement("target"), Q7B)
    # On the CPU they stay in RAM.
    cpu, _ = plan_pair(Q7B, Q05B, NO_GPU, adapter_bytes=(adapter, 0))
    assert cpu.target.weights_cpu == plan_pair(Q7B, Q05B, NO_GPU)[0].target.weights_cpu + adapter


def test_option_values_and_sizes():
    assert gpu_layers("auto") is None and gpu_layers("ALL") == -1 and gpu_layers("12") == 12
    with pytest.raises(ValueError):
        gpu_layers("most")
    assert parse_size("8GiB") == parse_size("8 GB") == parse_size("8g") == 8 * GIB
    assert parse_size("512MiB") == 512 << 20 and parse_size("1.5G") == 3 * GIB // 2
    for bad in ("eight", "0GiB", "8XB"):
        with pytest.raises(SettingsError):
            parse_size(bad)
    with pytest.raises(SettingsError, match="not both"):
        what_if(HOST, gpu_memory=GIB, unified_memory=GIB)


@pytest.fixture
def tiny_pair(tmp_path):
    t = tinygguf.write(tmp_path / "t.gguf", n_layer=8, n_embd=64, n_head=8, n_head_kv=2)
    d = tinygguf.write(tmp_path / "d.gguf", n_layer=2, n_embd=32, n_head=4, n_head_kv=2)
    return str(t), str(d)


def test_the_load_plan_resolves_auto_and_keeps_numbers(tiny_pair):
    t, d = tiny_pair
    plan = plan_load(ModelConfig(t, n_ctx=256), ModelConfig(d, n_ctx=256), machine=card(8))
    assert plan.target.n_gpu_layers == 9 and plan.draft.n_gpu_layers == 3
    # On a GPU, llama.cpp's threads (the physical cores), unless told.
    assert plan.target.n_threads == plan.draft.n_threads == physical_cores()
    assert plan.offload.line().startswith("target 8/8 layers on Test GPU 8 GiB")
    # A draft on the GPU keeps its file: no CPU requantization.
    assert plan.draft_quant is None
    given = plan_load(ModelConfig(t, n_ctx=256, n_gpu_layers=3),
                      ModelConfig(d, n_ctx=256, n_gpu_layers=0), machine=card(8))
    assert given.target.n_gpu_layers == 3 and given.draft.n_gpu_layers == 0
    cpu = plan_load(ModelConfig(t, n_ctx=256), ModelConfig(d, n_ctx=256), machine=NO_GPU)
    assert cpu.target.n_gpu_layers == 0 and cpu.draft.n_gpu_layers == 0
    assert "CPU only" in cpu.offload.line() and cpu.draft_quant == "q4_0"
    assert cpu.target.n_threads is None
    told = plan_load(ModelConfig(t, n_ctx=256, n_threads=3), None, machine=card(8))
    assert told.target.n_threads == 3


def test_the_early_exit_drafter_gets_the_room_left(tiny_pair):
    t, d = tiny_pair
    options = LoadOptions(early_exit=True, check_budget=False)
    plan = plan_load(ModelConfig(t, n_ctx=256), ModelConfig(d, n_ctx=256), options,
                     machine=card(8))
    ee = plan.offload.placement("early exit")
    assert ee is not None and ee.n_layer == 6 and plan.early_exit_gpu_layers == 7
    given = plan_load(ModelConfig(t, n_ctx=256, n_gpu_layers=2), ModelConfig(d, n_ctx=256),
                      options, machine=card(8))
    assert given.early_exit_gpu_layers == 2
    cpu = plan_load(ModelConfig(t, n_ctx=256), None, options, machine=NO_GPU)
    assert cpu.early_exit_gpu_layers == 0


def test_every_model_loads_with_the_gpu_layers_its_plan_gave(tiny_pair, tmp_path, monkeypatch):
    # Target, draft and the early-exit drafter (derived from the target) each reach the
    # loader, which hands them to llama.cpp, with the count the plan placed.
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "store"))
    t, d = tiny_pair
    options = LoadOptions(early_exit=True, check_budget=False)
    plan = plan_load(ModelConfig(t, n_ctx=256), ModelConfig(d, n_ctx=256), options,
                     machine=card(8))
    loaded: list[ModelConfig] = []

    def loader(config: ModelConfig) -> FakeBackend:
        loaded.append(config)
        return FakeBackend(eog=59)

    execute(plan, loader).close()
    assert plan.target.n_gpu_layers == 9 and plan.draft is not None
    assert [c.n_gpu_layers for c in loaded] == [9, plan.draft.n_gpu_layers,
                                                plan.early_exit_gpu_layers]
    assert loaded[2].path != t and plan.early_exit_gpu_layers == 7


def test_every_command_prints_the_plan_once_and_loads_as_planned(tiny_pair, monkeypatch):
    t, _ = tiny_pair
    vocab_pair = [tinygguf.write(Path(t).parent / f"{r}.gguf", tokens=tinygguf.vocab(64),
                                 n_layer=4) for r in ("t2", "d2")]
    loaded: list[ModelConfig] = []

    def fake_load(config: ModelConfig) -> FakeBackend:
        loaded.append(config)
        return FakeBackend(eog=59)
    monkeypatch.setattr("loading.devices.detect", lambda: card(8))
    err = io.StringIO()
    with mock.patch.object(llama_backend, "load", fake_load), \
            contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli_main(["generate", "--prompt", "hi", "--target", str(vocab_pair[0]),
                       "--draft", str(vocab_pair[1]), "--max-tokens", "3", "--no-history"])
    lines = [ln for ln in err.getvalue().splitlines() if ln.startswith("offload: ")]
    assert rc == 0 and len(lines) == 1, err.getvalue()
    assert lines[0].startswith("offload: target 4/4 layers on Test GPU 8 GiB")
    assert [c.n_gpu_layers for c in loaded] == [5, 5]


def test_the_holder_keeps_the_plan_for_the_header_and_the_api(tiny_pair, monkeypatch):
    vocab_pair = [tinygguf.write(Path(tiny_pair[0]).parent / f"{r}.gguf",
                                 tokens=tinygguf.vocab(64)) for r in ("t3", "d3")]
    monkeypatch.setattr("loading.devices.detect", lambda: NO_GPU)
    heard = []
    holder = PairHolder(loader=lambda c: FakeBackend(eog=59), history_tokens=None,
                        announce=heard.append)
    assert holder.load(ModelConfig(str(vocab_pair[0]), n_ctx=256),
                       ModelConfig(str(vocab_pair[1]), n_ctx=256)) is None
    assert len(heard) == 1 and holder.offload is heard[0].offload
    assert "CPU only" in status_banner(holder)
    models = holder.offload.as_dict()["models"]
    assert [(m["role"], m["layers_placed"], m["layers_total"]) for m in models] == [
        ("target", 0, 2), ("draft", 0, 2)]
    holder.close()


class Worker:
    def __init__(self, endpoint: str, free: int) -> None:
        self.endpoint, self.free, self.total = endpoint, free, free


def test_rpc_workers_hold_the_target_and_the_draft_is_planned_here(tiny_pair):
    t, d = tiny_pair
    plan = plan_load(ModelConfig(t, n_ctx=256, rpc=("10.0.0.2:50052",)),
                     ModelConfig(d, n_ctx=256), probe=lambda eps: [Worker(eps[0], 8 * GIB)],
                     machine=card(8))
    assert plan.target.n_gpu_layers == -1 and plan.draft.n_gpu_layers == 3
    assert plan.offload.placement("target").on == "RPC workers"
    assert plan.offload.line().startswith("target 8/8 layers on RPC workers")
    own = plan_load(ModelConfig(t, n_ctx=256), ModelConfig(d, n_ctx=256, rpc=("10.0.0.3:50052",)),
                    machine=card(8))
    assert own.draft.n_gpu_layers == -1 and own.offload.placement("draft").on == "RPC workers"
    assert own.target.n_gpu_layers == 9


def test_the_models_tab_shows_the_plan_before_loading(tiny_pair, monkeypatch):
    monkeypatch.setattr("loading.devices.detect", lambda: card(3))
    html, ok = wizard._fit_html(wizard.ModelChoice("", tiny_pair[0]),
                                wizard.ModelChoice("", tiny_pair[1]), LoaderSettings(ctx=256))
    assert ok and "tandem-offload-plan" in html and "target 8/8 layers on Test GPU 3 GiB" in html


def test_a_pair_on_the_gpu_is_released_before_the_next_plan_reads_free_memory(tiny_pair, monkeypatch):
    # The registry reports what the loaded pair left free: planned beside it, the next pair
    # would get only that. So the holder closes a pair with GPU layers before planning; a pair
    # on the CPU stays in service until the new one is up (and after a failed load).
    vocab_pair = [tinygguf.write(Path(tiny_pair[0]).parent / f"{r}.gguf",
                                 tokens=tinygguf.vocab(64)) for r in ("t4", "d4")]
    events: list[str] = []

    class Tracked(FakeBackend):
        def close(self) -> None:
            events.append("closed")
            super().close()

    def loader(config: ModelConfig) -> FakeBackend:
        events.append("loaded")
        return Tracked(eog=59)

    def detect() -> Machine:
        events.append("planned")
        return card(8)

    monkeypatch.setattr("loading.devices.detect", detect)
    holder = PairHolder(loader=loader, history_tokens=None)
    configs = (ModelConfig(str(vocab_pair[0]), n_ctx=256), ModelConfig(str(vocab_pair[1]), n_ctx=256))
    assert holder.load(*configs) is None and holder.offload is not None and holder.offload.used
    events.clear()
    assert holder.load(*configs) is None
    assert events[:3] == ["closed", "closed", "planned"] and events.count("loaded") == 2
    # On the CPU the old pair is kept until the new one is up.
    monkeypatch.setattr("loading.devices.detect", lambda: (events.append("planned"), NO_GPU)[1])
    holder.load(*configs)
    events.clear()
    assert holder.load(*configs) is None
    assert events[0] == "planned" and events[-2:] == ["closed", "closed"]
    holder.close()


def test_flash_attention_and_the_kv_cache_type_size_the_plan():
    from engine import attention
    from models import budget
    # The plan sizes the KV cache types the engine offers, and counts flash attention as the
    # engine turns it on.
    assert set(budget.KV_TYPES) == set(attention.KV_TYPES)
    for setting in attention.FLASH_ATTN:
        for kv in attention.KV_TYPES:
            for on_gpu in (False, True):
                engine_says = attention.flash_attn_on(setting, on_gpu, kv)
                assert budget.flash_in_use(setting, on_gpu, kv) == (
                    True if engine_says is None else engine_says)
    long = dict(n_ctx=32768, gpu_layers=-1, draft_gpu_layers=-1)
    auto, _ = plan_pair(Q7B, Q05B, card(24), **long)
    off, _ = plan_pair(Q7B, Q05B, card(24), flash_attn="off", **long)
    # Without flash attention the score matrices take the GPU's compute buffer up.
    assert off.target.compute_gpu > auto.target.compute_gpu
    assert off.target.weights_gpu == auto.target.weights_gpu
    q8, _ = plan_pair(Q7B, Q05B, card(24), kv_type="q8_0", **long)
    assert q8.target.kv_gpu * 2 < auto.target.kv_gpu * 1.1 and q8.target.kv_gpu < auto.target.kv_gpu
    # On 8 GiB, auto places fewer target layers with an f16 cache than with a q4_0 one.
    _, f16_plan = plan_pair(Q7B, Q05B, card(8), n_ctx=32768)
    _, q4_plan = plan_pair(Q7B, Q05B, card(8), n_ctx=32768, kv_type="q4_0")
    assert f16_plan.placement("target").placed < q4_plan.placement("target").placed


def test_the_load_plan_sizes_the_configs_attention_settings(tiny_pair):
    t, d = tiny_pair
    f16 = plan_load(ModelConfig(t, n_ctx=2048), ModelConfig(d, n_ctx=2048), machine=card(8))
    q4 = plan_load(ModelConfig(t, n_ctx=2048, kv_type="q4_0"),
                   ModelConfig(d, n_ctx=2048, kv_type="q4_0"), machine=card(8))
    assert q4.offload.placement("target").kv * 3 < f16.offload.placement("target").kv
    assert q4.target.kv_type == "q4_0" and q4.draft.kv_type == "q4_0"


def two_cards(first: float, last: float) -> Machine:
    from models.machine import Gpu
    cards = (Gpu("Card A", int(first * GIB), int(first * GIB)),
             Gpu("Card B", int(last * GIB), int(last * GIB)))
    return Machine(64 * GIB, 60 * GIB, "2 GPUs (Card A, Card B)", sum(g.free for g in cards),
                   sum(g.total for g in cards), gpu_margin=2 * GPU_MARGIN, gpus=cards)


def test_several_gpus_are_placed_per_card_with_the_output_on_the_last():
    from models.budget import device_bytes, estimate_model
    b = estimate_model(Q7B, role="target", n_ctx=4096, gpu_layers=29, flash_attn=True)
    even = device_bytes(Q7B, b, [8 * GIB, 8 * GIB])
    # Blocks split by free memory; the last card has the output matrix and the logits buffer.
    # 29 layers (28 blocks and the output) halved: blocks 0-14 on A, 15-27 and the output on B.
    per = Q7B.layer_bytes[0]
    assert even[0] == 15 * per + b.kv_gpu * 15 // 28 + b.attention_gpu
    assert even[1] == 13 * per + Q7B.output_bytes + b.kv_gpu * 13 // 28 + b.compute_gpu
    assert b.compute_gpu > b.attention_gpu
    # Fewer layers offloaded than the first card's share: all of them, output too, go there.
    few = estimate_model(Q7B, role="target", n_ctx=4096, gpu_layers=5, flash_attn=True)
    assert device_bytes(Q7B, few, [20 * GIB, 1 * GIB])[1] == 0
    # Pooled, 7B + 0.5B fit whole in 21.6 GiB less two margins; per card, the 1.6 GiB card
    # (0.6 GiB room) cannot take its share of the layers with the output: auto places fewer.
    _, pooled = plan_pair(Q7B, Q05B, card(21.6))
    assert whole(pooled.placement("target"), Q7B) and not pooled.devices
    report, plan = plan_pair(Q7B, Q05B, two_cards(20, 1.6))
    assert plan.placement("target").placed < Q7B.n_layer and report.ok
    assert [name for name, _, _ in plan.devices] == ["Card A", "Card B"]
    for _, used, free in plan.devices:
        assert used <= free - GPU_MARGIN
    assert "per GPU Card A" in plan.line() and plan.as_dict()["devices"][1]["name"] == "Card B"
    # A number given that overfills the last card is refused per card, not passed as pooled.
    given, _ = plan_pair(Q7B, Q05B, two_cards(20, 1.6), gpu_layers=-1, draft_gpu_layers=-1)
    assert given.verdict != "fits"


def test_a_model_loaded_after_the_pair_is_placed_per_card_too():
    from models.budget import device_bytes, estimate_model
    from models.offload import first_layers, place_after
    ee = first_layers(Q7B, 21, "7b first 21")
    kw = dict(n_ctx=4096, n_ubatch=512)
    _, pooled = plan_pair(Q7B, Q05B, card(21.6))
    whole_ee = place_after(pooled, card(21.6), "early exit", ee, **kw).models[-1]
    assert whole_ee.gpu_layers == ee.n_layer + 1
    m = two_cards(20, 1.6)
    _, plan = plan_pair(Q7B, Q05B, m)
    placed = place_after(plan, m, "early exit", ee, **kw).models[-1]
    # The small last card has no room for its share of all 22 layers: fewer go.
    assert 0 < placed.gpu_layers < ee.n_layer + 1
    left = [free - used for _, used, free in plan.devices]
    b = estimate_model(ee, role="early exit", gpu_layers=placed.gpu_layers, flash_attn=True, **kw)
    assert all(u <= f - GPU_MARGIN for u, f in zip(device_bytes(ee, b, left), left))

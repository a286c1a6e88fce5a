"""Prompt lookup, hybrid and early-exit drafters: proposals on crafted contexts, greedy exactness
on fake models, the early-exit GGUF derivation on tiny files, and one real early-exit load."""
from __future__ import annotations

import os

import gguf
import numpy as np
import pytest

from engine.backend import ModelConfig
from engine.drafters.base import Drafter, Proposal
from engine.drafters.draft_model import DraftModelDrafter
from engine.drafters.early_exit import early_exit_drafter
from engine.drafters.hybrid import HybridDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.errors import SettingsError
from engine.events import DoneEvent
from engine.generator import generate
from engine.generation_config import COPY_MAX, GenerationConfig
from engine.pair import Pair
from engine.control.registry import make_policy
from engine.rng import Rng
from engine.sampling import SamplingParams
from engine.transform import probabilities
from engine.session import Session
from loading.derived.early_exit import (LAYERS_KEY, SOURCE_KEY, block_count, default_layers,
                                        derive_early_exit)
from loading.derived.files import file_sha256
from loading.options import LoadOptions
from loading.load import add_early_exit, load_pair
from models.gguf_info import read_info
from tests import tinygguf
from bench.fakes.backend import FakeBackend

GREEDY = SamplingParams(temperature=0.0)
RNG = Rng(0)
PROMPT = [3, 14, 15, 9, 26]
TEXT = "abcab"


def lookup_tokens(drafter, context, gamma):
    return drafter.draft(context, gamma, GREEDY, RNG).tokens.tolist()


# --- prompt lookup ---------------------------------------------------------------------------

def test_lookup_copies_what_followed_the_matching_ngram():
    ctx = [1, 2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4]
    p = PromptLookupDrafter(ngram_max=3).draft(ctx, 3, GREEDY, RNG)
    assert p.tokens.tolist() == [5, 6, 7]
    assert p.q is None and p.source == "prompt-lookup"
    plan = PromptLookupDrafter(ngram_max=3).plan(ctx, GREEDY)
    assert plan.is_copy and plan.source == "context" and plan.match == 3
    assert p.tokens.dtype == np.int32


def test_lookup_without_a_match_proposes_nothing():
    p = PromptLookupDrafter(ngram_max=3).draft([1, 2, 3, 4, 5], 4, GREEDY, RNG)
    assert len(p) == 0
    assert not PromptLookupDrafter(ngram_max=3).plan([1, 2, 3, 4, 5], GREEDY).drafts


def test_lookup_prefers_the_longest_ngram():
    # "4" alone last occurred before 9, but "3 4" occurred before 7: the bigram decides.
    ctx = [3, 4, 7, 7, 1, 4, 9, 9, 5, 3, 4]
    assert lookup_tokens(PromptLookupDrafter(ngram_max=2), ctx, 2) == [7, 7]
    assert lookup_tokens(PromptLookupDrafter(ngram_max=1), ctx, 2) == [9, 9]


def test_lookup_respects_gamma_the_max_length_and_the_minimum_ngram():
    ctx = list(range(10, 30)) + [10]
    assert lookup_tokens(PromptLookupDrafter(), ctx, 5) == [11, 12, 13, 14, 15]
    assert lookup_tokens(PromptLookupDrafter(max_draft=2), ctx, 5) == [11, 12]
    assert lookup_tokens(PromptLookupDrafter(ngram_min=2), ctx, 5) == []
    assert lookup_tokens(PromptLookupDrafter(), ctx, 0) == []


def test_lookup_takes_the_latest_match_with_a_full_copy_after_it_else_the_latest():
    ctx = [5, 1, 2, 3, 4, 9, 5, 6, 5]
    assert lookup_tokens(PromptLookupDrafter(ngram_max=1, max_draft=2), ctx, 2) == [6, 5]
    # The latest occurrence has only two tokens after it; the first has enough.
    assert lookup_tokens(PromptLookupDrafter(ngram_max=1, max_draft=3), ctx, 3) == [1, 2, 3]
    # None has sixteen: the latest, as far as it goes.
    assert lookup_tokens(PromptLookupDrafter(ngram_max=1), ctx, 3) == [6, 5]


def test_lookup_copy_ends_at_an_end_of_generation_token():
    # The prompt's own turn end (63 here) follows the matched bigram: copying past it would only
    # widen the verify batch, since nothing after an end of generation is committed.
    ctx = [1, 2, 63, 5, 6, 7, 1, 2]
    assert lookup_tokens(PromptLookupDrafter(ngram_max=2), ctx, 4) == [63, 5, 6, 7]
    ending = PromptLookupDrafter(ngram_max=2, is_eog=lambda t: t == 63)
    assert lookup_tokens(ending, ctx, 4) == [63]
    assert lookup_tokens(ending, [1, 2, 5, 6, 7, 1, 2], 3) == [5, 6, 7]
    # The index finds the end tokens as the text grows: one that arrives later cuts the copies
    # that reach it, and the text's own last token counts too.
    grown = [1, 2, 5, 6, 7, 1, 2]
    assert ending.plan(grown, SamplingParams()).tokens == (5, 6, 7, 1, 2)
    index = ending._index
    grown += [63, 1, 2]
    assert ending.plan(grown, SamplingParams()).tokens == (63,)
    grown.append(5)
    assert ending.plan(grown, SamplingParams()).tokens == (6, 7, 1, 2, 63)
    assert ending._index is index


def test_lookup_refuses_bad_sizes():
    with pytest.raises(SettingsError):
        PromptLookupDrafter(ngram_max=1, ngram_min=2)
    with pytest.raises(SettingsError):
        PromptLookupDrafter(max_draft=0)


# --- hybrid ----------------------------------------------------------------------------------

class RecordingDrafter(Drafter):
    def __init__(self) -> None:
        self.name = "model"
        self.calls = 0
        self.heard: list[int] = []
        self.prefilled: list[int] | None = None

    def prefill(self, context):
        self.prefilled = list(context)

    def propose(self, plan, gamma, params, rng, keep=None):
        self.calls += 1
        return Proposal(tokens=np.full(gamma, 7, dtype=np.int32), q=None, source=self.name)

    def feedback(self, plan, proposal, n_accepted):
        self.heard.append(n_accepted)


def test_hybrid_uses_lookup_when_it_matches_and_the_model_otherwise():
    model = RecordingDrafter()
    h = HybridDrafter(PromptLookupDrafter(ngram_max=2), model)
    plan = h.plan([1, 2, 3, 9, 1, 2], GREEDY)
    hit = h.propose(plan, 2, GREEDY, RNG)
    assert hit.source == "prompt-lookup" and hit.tokens.tolist() == [3, 9] and model.calls == 0
    h.feedback(plan, hit, 1)
    assert model.heard == []
    plan = h.plan([1, 2, 3, 4], GREEDY)
    miss = h.propose(plan, 3, GREEDY, RNG)
    assert miss.source == "model" and miss.tokens.tolist() == [7, 7, 7] and model.calls == 1
    h.feedback(plan, miss, 2)
    assert model.heard == [2]
    # The model is not prefilled: it catches up when it next drafts, so a round that copies
    # never pays its decode of the prompt.
    h.prefill([4, 5])
    assert model.prefilled is None


# --- greedy exactness on fakes ---------------------------------------------------------------

def run_tokens(target, drafter, gamma, policy=None, max_tokens=48):
    config = GenerationConfig(params=GREEDY, gamma=gamma, max_tokens=max_tokens)
    done = None
    for ev in generate(target, drafter, PROMPT, config, policy):
        if isinstance(ev, DoneEvent):
            done = ev
    assert done is not None
    # The generator's invariant: the target holds every committed token but the last.
    assert target.tokens == (PROMPT + list(done.tokens))[:-1] == target.backend.cache
    return list(done.tokens), done.stats


def baseline(max_tokens=48):
    return run_tokens(Session(FakeBackend(order=1, n_vocab=16)), None, 0, max_tokens=max_tokens)[0]


def fake_drafters():
    # order=1 with a small vocabulary makes greedy text cycle, so lookup finds matches.
    return {
        "lookup": PromptLookupDrafter(),
        "hybrid": HybridDrafter(PromptLookupDrafter(ngram_min=2),
                                DraftModelDrafter(FakeBackend(order=1, n_vocab=16, noise=2.0))),
        "early-exit": early_exit_drafter(FakeBackend(order=1, n_vocab=16, noise=2.0)),
    }


@pytest.mark.parametrize("name", ["lookup", "hybrid", "early-exit"])
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_output_equals_the_baseline_for_every_new_drafter(name, gamma):
    expected = baseline()
    drafter = fake_drafters()[name]
    tokens, stats = run_tokens(Session(FakeBackend(order=1, n_vocab=16)), drafter, gamma)
    assert tokens == expected
    assert stats.drafted_tokens > 0 and stats.accepted_tokens > 0


@pytest.mark.parametrize("policy", ["fixed", "heuristic", "adaptive"])
@pytest.mark.parametrize("name", ["draft", "lookup", "hybrid"])
def test_pair_generates_the_baseline_text_with_every_drafter_and_policy(name, policy):
    pair = Pair(FakeBackend(order=1, n_vocab=16), FakeBackend(order=1, n_vocab=16, noise=2.0))
    config = GenerationConfig(params=GREEDY, gamma=4, max_tokens=40)
    ref = [ev for ev in pair.generate(TEXT, config, drafter="plain", raw=True)][-1]
    chosen = pair.make_policy(policy, name, 4)
    done = [ev for ev in pair.generate(TEXT, config, drafter=name, raw=True, policy=chosen)][-1]
    assert done.tokens == ref.tokens
    assert done.stats.drafter == pair.drafter(name).name


def test_pair_offers_lookup_and_suffix_without_a_draft_model_and_hybrid_only_with_one():
    assert Pair(FakeBackend()).drafters == ["plain", "lookup", "suffix"]
    assert set(Pair(FakeBackend(), FakeBackend()).drafters) == {"plain", "draft", "hybrid",
                                                                 "lookup", "suffix"}


def test_the_default_drafter_is_hybrid_with_a_draft_model_and_plain_without():
    pair = Pair(FakeBackend(order=1, n_vocab=16), FakeBackend(order=1, n_vocab=16, noise=2.0))
    assert pair.default_drafter == "hybrid"
    config = GenerationConfig(params=GREEDY, gamma=3, max_tokens=12)
    done = [ev for ev in pair.generate(TEXT, config, raw=True)][-1]
    assert done.stats.drafter == pair.drafter("hybrid").name and "hybrid" in pair.knowledge
    alone = Pair(FakeBackend(order=1, n_vocab=16))
    assert alone.default_drafter == "plain"
    done = [ev for ev in alone.generate(TEXT, config, raw=True)][-1]
    assert done.stats.mode == "plain"


def test_pair_default_policy_is_the_adaptive_controller_calibrated_once_per_drafter():
    pair = Pair(FakeBackend(order=1, n_vocab=16), FakeBackend(order=1, n_vocab=16, noise=2.0))
    config = GenerationConfig(params=GREEDY, gamma=3, max_tokens=20)
    done = [ev for ev in pair.generate(TEXT, config, drafter="draft", raw=True)][-1]
    assert all(p is not None for p in done.stats.predicted_tps)
    first = pair.knowledge["draft"]
    # Widths 1..65 whatever gamma: the widest round the adaptive controller prices, a copy's.
    assert len(first.verify_ms) == COPY_MAX + 1 and first.model_name == "draft-model"
    [ev for ev in pair.generate(TEXT, config, drafter="draft", raw=True)]
    assert pair.knowledge["draft"] is first
    fixed = [ev for ev in pair.generate(TEXT, config, drafter="draft", raw=True,
                                        policy=make_policy("fixed", 3))][-1]
    assert fixed.stats.predicted_tps == [None] * fixed.stats.rounds
    # The fixed policy's run used the same calibration for its padding, without recalibrating.
    assert pair.knowledge["draft"] is first


# --- early-exit derivation -------------------------------------------------------------------

@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "store"))
    return tmp_path / "store"


def tensor_names(path):
    return sorted(t.name for t in gguf.GGUFReader(str(path)).tensors)


def test_early_exit_keeps_the_first_k_blocks_and_rewrites_block_count(store, tmp_path):
    target = tinygguf.write(tmp_path / "tiny.gguf", n_layer=4)
    out = derive_early_exit(target, 2)
    assert out.parent == store / "derived"
    assert block_count(out) == 2 and block_count(target) == 4
    assert tensor_names(out) == ["blk.0.attn_q.weight", "blk.1.attn_q.weight", "token_embd.weight"]
    reader = gguf.GGUFReader(str(out))
    sha = file_sha256(target)
    assert reader.fields[SOURCE_KEY].contents() == sha and sha[:16] in out.name
    assert reader.fields[LAYERS_KEY].contents() == 2
    # Everything else is copied: the tokenizer survives intact.
    orig = gguf.GGUFReader(str(target))
    assert reader.fields["tokenizer.ggml.tokens"].contents() == orig.fields["tokenizer.ggml.tokens"].contents()
    assert reader.fields["tokenizer.chat_template"].contents() == tinygguf.TEMPLATE
    kept = {t.name: t for t in reader.tensors}
    np.testing.assert_array_equal(kept["token_embd.weight"].data,
                                  {t.name: t for t in orig.tensors}["token_embd.weight"].data)


def test_early_exit_is_reused_while_the_target_is_unchanged_and_rebuilt_when_it_changes(store, tmp_path):
    target = tinygguf.write(tmp_path / "tiny.gguf", n_layer=4)
    first = derive_early_exit(target, 3)
    stamp = first.stat().st_mtime_ns
    assert derive_early_exit(target, 3) == first and first.stat().st_mtime_ns == stamp
    tinygguf.write(target, n_layer=4, n_embd=8)
    # A changed size/mtime invalidates the cached hash, so the new content is hashed.
    os.utime(target, ns=(stamp + 10**9, stamp + 10**9))
    second = derive_early_exit(target, 3)
    assert second != first and not first.exists()
    assert gguf.GGUFReader(str(second)).fields[SOURCE_KEY].contents() == file_sha256(target)


def test_early_exit_layer_count_must_leave_the_target_smaller(store, tmp_path):
    target = tinygguf.write(tmp_path / "tiny.gguf", n_layer=4)
    for bad in (0, 4, 9):
        with pytest.raises(SettingsError, match="early-exit layers"):
            derive_early_exit(target, bad)
    assert not list((store / "derived").glob("*.gguf"))


def test_load_pair_adds_the_early_exit_drafter_from_the_derived_file(store, tmp_path):
    target = tinygguf.write(tmp_path / "tiny.gguf", n_layer=4)
    loaded, closed = [], []

    class Closing(FakeBackend):
        def close(self) -> None:
            closed.append(self)

    def loader(cfg):
        loaded.append(cfg.path)
        return Closing(order=1, n_vocab=16)

    pair = load_pair(ModelConfig(str(target)), None,
                     LoadOptions(check_compat=False, check_budget=False, early_exit=True), loader=loader)
    assert default_layers(4) == 3 and block_count(loaded[1]) == 3
    assert loaded[1] == str(derive_early_exit(target, 3))
    assert pair.drafters == ["plain", "lookup", "suffix", "early-exit"]
    config = GenerationConfig(params=GREEDY, gamma=3, max_tokens=24)
    ref = [ev for ev in pair.generate(TEXT, config, drafter="plain", raw=True)][-1]
    done = [ev for ev in pair.generate(TEXT, config, drafter="early-exit", raw=True)][-1]
    assert done.tokens == ref.tokens and done.stats.drafter == "early-exit"
    first = pair.drafter("early-exit").session.backend
    add_early_exit(pair, ModelConfig(str(target)), 2, loader=loader)
    # The new early-exit model replaces the old one, which is closed; the pair closes the rest.
    assert block_count(loaded[2]) == 2 and closed == [first]
    second = pair.drafter("early-exit").session.backend
    assert second is not first and pair.n_ctx == second.n_ctx
    pair.close()
    assert len(closed) == 3 and second in closed


@pytest.mark.real
def test_early_exit_of_the_embedded_target_loads_in_llama_cpp_and_drafts(embedded_paths):
    from engine.llama.backend import load

    layers = default_layers(read_info(embedded_paths[0]).n_layer)
    path = derive_early_exit(embedded_paths[0], layers)
    assert read_info(path).n_layer == layers
    backend = load(ModelConfig(str(path), n_ctx=128, n_threads=2))
    try:
        drafter = early_exit_drafter(backend)
        context = backend.tokenize("def add(a, b):\n    return", True, True)
        p = drafter.draft(context, 3, GREEDY, Rng(0))
        assert len(p) == 3 and p.source == "early-exit" and p.q is None
        assert all(0 <= t < backend.n_vocab for t in p.tokens)
        assert drafter.session.tokens == context + p.tokens.tolist()[:-1]
    finally:
        backend.close()


# --- draft model: stopping on its own probabilities --------------------------------------------

def test_the_draft_model_stops_once_its_run_is_unlikely_and_keeps_the_token_that_crossed():
    params = SamplingParams(temperature=1.0)
    free = DraftModelDrafter(FakeBackend(scale=1.0), chain_min=0.0)
    stopping = DraftModelDrafter(FakeBackend(scale=1.0), chain_min=0.3)
    lengths = []
    for seed in range(20):
        full = free.draft(PROMPT, 6, params, Rng(seed))
        assert len(full) == 6
        p = stopping.draft(PROMPT, 6, params, Rng(seed))
        own = np.array([q.prob(int(x)) for q, x in zip(p.q, p.tokens)])
        # Same seed, same model: the stopped proposal is a prefix of the full one.
        assert p.tokens.tolist() == full.tokens.tolist()[:len(p)]
        # Every token but the last leaves the run's probability at or above chain_min; the
        # last one took it under (or gamma was reached).
        assert np.prod(own[:-1]) >= 0.3
        assert len(p) == 6 or np.prod(own) < 0.3
        lengths.append(len(p))
    # A flat fake (scale 1) is unsure of most tokens: the stop really happens.
    assert min(lengths) < 6 and sum(lengths) < 6 * 20
    # Decodes: one to sync plus one per drafted token but the last.
    assert stopping.session.n_past == len(PROMPT) + len(p) - 1


def test_the_draft_model_stops_after_an_end_of_generation_token():
    full = DraftModelDrafter(FakeBackend()).draft(PROMPT, 6, GREEDY, RNG).tokens.tolist()
    end = full[2]
    assert end not in full[:2]
    backend = FakeBackend()
    backend.is_eog = lambda t: t == end
    drafter = DraftModelDrafter(backend)
    p = drafter.draft(PROMPT, 6, GREEDY, RNG)
    # The end token is proposed (the target may accept it and finish), nothing after it; no
    # decode was spent on it.
    assert p.tokens.tolist() == full[:3]
    assert drafter.session.n_past == len(PROMPT) + 2


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=1.0)])
def test_p_min_stops_before_a_row_the_draft_is_unsure_of(params):
    # A flat fake (scale 1, 64 tokens) is never half sure of a token: with p_min 0.5 only the
    # first token, which p_min never stops, is proposed. It reads the next row's largest
    # probability before drawing (untempered when greedy), never the drawn token's.
    fake = FakeBackend(scale=1.0)
    unsure = DraftModelDrafter(FakeBackend(scale=1.0), p_min=0.5).draft(
        PROMPT, 4, params, Rng(0))
    second_row = fake._row(PROMPT + unsure.tokens.tolist())
    assert len(unsure) == 1 and probabilities(second_row, SamplingParams(1.0)).max() < 0.5
    free = DraftModelDrafter(FakeBackend(scale=1.0)).draft(PROMPT, 4, params,
                                                             Rng(0))
    assert len(free) == 4 and free.tokens[0] == unsure.tokens[0]
    loose = DraftModelDrafter(FakeBackend(scale=1.0), p_min=0.01).draft(
        PROMPT, 4, params, Rng(0))
    assert loose.tokens.tolist() == free.tokens.tolist()


def test_a_greedy_draft_gives_its_tokens_without_q_rows():
    p = DraftModelDrafter(FakeBackend()).draft(PROMPT, 3, GREEDY, RNG)
    # q one-hot at each token: the same as no q under the one-hot rule.
    assert p.q is None and len(p) == 3


def test_draft_stop_settings_are_checked():
    with pytest.raises(SettingsError, match="chain-min"):
        DraftModelDrafter(FakeBackend(), chain_min=1.0)
    with pytest.raises(SettingsError, match="chain-min"):
        Pair(FakeBackend(), FakeBackend(), chain_min=-0.1)


def _scan_find(context, want, ngram_max, ngram_min):
    """Prompt lookup's match as a full scan of the context (what the index replaced)."""
    from numpy.lib.stride_tricks import sliding_window_view
    ctx = np.asarray(context, dtype=np.int64)
    size = len(ctx)
    for n in range(min(ngram_max, size - 1), ngram_min - 1, -1):
        hits = np.flatnonzero(np.all(sliding_window_view(ctx[:-1], n) == ctx[size - n:], axis=1))
        if hits.size == 0:
            continue
        full = hits[size - (hits + n) >= want]
        start = int(full[-1] if full.size else hits[0]) + n
        return n, start, min(want, size - start)
    return 0, 0, 0


@pytest.mark.parametrize("seed", range(4))
def test_the_lookup_index_finds_what_a_full_scan_finds_as_the_context_grows(seed):
    rng = np.random.default_rng(seed)
    lookup = PromptLookupDrafter(ngram_max=3, ngram_min=1)
    context = [int(t) for t in rng.integers(0, 6, 5)]
    for _ in range(120):
        for want in (1, 4):
            assert lookup.find(context, want) == _scan_find(context, want, 3, 1)
        context.append(int(rng.integers(0, 6)))
    # Another list (a new generation) starts a new index.
    other = [int(t) for t in rng.integers(0, 6, 30)]
    assert lookup.find(other, 2) == _scan_find(other, 2, 3, 1)

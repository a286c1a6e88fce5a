"""The engine's own time per committed token on the free paths (the package docstring): plain
decoding, each drafter at a fixed gamma and the default, over text that repeats, fresh text and
losing copies, every sampling mode, the backends' own time subtracted."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from bench.fakes.instant import CopyRefusingBackend, InstantBackend
from bench.overhead.banks import QWEN_VOCAB, llm_like_bank, pairs_text
from bench.overhead.history import HistoryTiming, time_history, zipf_history
from engine.control.costs import Calibration
from engine.drafters.base import PLAIN, plain_alias
from engine.drafters.history_index import HistoryIndex
from engine.drafters.suffix import SUFFIX
from engine.events import DoneEvent, RoundEvent
from engine.generation_config import COPY_MAX, GenerationConfig
from engine.grammar.guide import CompiledGrammar
from engine.pair import Pair
from engine.sampling import SamplingParams

# The suffix drafter's history in the overhead runs: issue 30's size for the lookup's bound.
HISTORY_TOKENS = 10_000_000
HISTORY_LABEL = "history"

MODES = {
    "greedy": SamplingParams(temperature=0.0, seed=0),
    "T 1.0": SamplingParams(temperature=1.0, seed=0),
    "T 0.7, top-p 0.9": SamplingParams(temperature=0.7, top_p=0.9, seed=0),
    "T 0.8, top-k 40, top-p 0.95, min-p 0.05": SamplingParams(temperature=0.8, top_k=40,
                                                              top_p=0.95, min_p=0.05, seed=0),
}
FRESH_LABEL = "fresh text"
# The history of the fresh-text path with a history: the budget's 2,000,000 tokens.
FRESH_HISTORY_TOKENS = 2_000_000
COPY_LABEL = "losing copies"
# The letters of the losing-copies text: every row's sixteen likeliest tokens (`llm_like_bank`).
COPY_LETTERS = "abcdefghijklmnop"
# (label, drafter, gamma, policy): plain decoding, each drafter at a fixed gamma, and the default
# (hybrid with the adaptive controller, whose calibration here measures backends that cost
# nothing: what is timed is its bookkeeping, not its choices); then plain and the default where
# nothing drafts (the module docstring).
PATHS = (("plain", PLAIN, 0, "fixed"), ("draft model, γ 4", "draft", 4, "fixed"),
         ("prompt lookup, γ 4", "lookup", 4, "fixed"), ("hybrid, γ 4", "hybrid", 4, "fixed"),
         ("default: hybrid, adaptive ≤ 8", "hybrid", 8, "adaptive"),
         (f"suffix, γ 4, {HISTORY_LABEL}", SUFFIX, 4, "fixed"),
         (f"default, {HISTORY_LABEL}", "hybrid", 8, "adaptive"),
         (f"plain on {FRESH_LABEL}", PLAIN, 0, "fixed"),
         (f"default on {FRESH_LABEL}", "hybrid", 8, "adaptive"),
         (f"default on {FRESH_LABEL} with a 2M {HISTORY_LABEL}", "hybrid", 8, "adaptive"),
         (f"plain on {COPY_LABEL}", PLAIN, 0, "fixed"),
         (f"default on {COPY_LABEL}", "hybrid", 8, "adaptive"))
# Paths that draft from a history of past requests (the suffix drafter's index, filled with
# `history_tokens` tokens of Zipf-distributed documents; 2,000,000 on fresh text).
HISTORY_PATHS = {p[0] for p in PATHS if HISTORY_LABEL in p[0]}
# Paths over the backends whose text never repeats.
FRESH_PATHS = {p[0] for p in PATHS if FRESH_LABEL in p[0]}
# The default's costs where nothing drafts: a compute-bound CPU's curve (a verify of w tokens
# costs w of one, a draft token 0.3 of one), on which no draft and no copy short of certain pays,
# so its rounds stay plain whatever the instant backends' timings (noise) would have made of a
# calibration: what is timed is the bookkeeping of rounds that stay plain.
COMPUTE_BOUND = Calibration(draft_ms=[0.3 * w for w in range(1, COPY_MAX + 2)],
                            verify_ms=[float(w) for w in range(1, COPY_MAX + 2)])
# Paths over the backends whose copies lose.
COPY_PATHS = {p[0] for p in PATHS if COPY_LABEL in p[0]}


@dataclass(frozen=True)
class OverheadRow:
    path: str
    mode: str
    ms_per_token: float  # engine time per committed token, median over repeats
    ms_per_round: float
    tokens_per_round: float
    acceptance: float  # accepted / drafted (nan for plain)


def measure(pair: Pair, target: InstantBackend, draft: InstantBackend, drafter: str, gamma: int,
            policy_name: str, params: SamplingParams, max_tokens: int, prompt: str,
            history: HistoryIndex | None = None, grammar: CompiledGrammar | None = None
            ) -> tuple[float, int, int, int, int, int]:
    """One generation: (engine seconds, committed tokens, rounds, drafted, accepted, forced)."""
    config = GenerationConfig(params=params, gamma=gamma, max_tokens=max_tokens, grammar=grammar)
    policy = pair.make_policy(policy_name, drafter, gamma) if gamma else None
    target.decode_s = draft.decode_s = 0.0
    t0 = time.thread_time()
    rounds = drafted = accepted = tokens = forced = 0
    for ev in pair.generate(prompt, config, drafter=drafter, raw=True, policy=policy,
                            history=history):
        if isinstance(ev, RoundEvent):
            rounds += 1
            drafted += ev.round.drafted
            accepted += ev.round.accepted
        elif isinstance(ev, DoneEvent):
            tokens, forced = len(ev.tokens), ev.stats.forced_tokens
    spent = time.thread_time() - t0
    return spent - target.decode_s - draft.decode_s, tokens, rounds, drafted, accepted, forced


def run_overhead(n_vocab: int = QWEN_VOCAB, max_tokens: int = 256, repeats: int = 5,
                 modes: Sequence[str] = tuple(MODES), paths: Sequence[str] = (),
                 noise: float = 0.5, history_tokens: int = HISTORY_TOKENS,
                 fresh_history_tokens: int = FRESH_HISTORY_TOKENS
                 ) -> tuple[list[OverheadRow], HistoryTiming | None]:
    """Every path x mode, `repeats` generations each, interleaved so drift hits all alike;
    and, when a path drafts from a history, that history's lookup and add times."""
    bank = llm_like_bank(n_vocab, seed=0)
    draft_bank = bank + np.random.default_rng(1).standard_normal(bank.shape,
                                                                 dtype=np.float32) * noise
    target, draft = InstantBackend(bank, "instant-target"), InstantBackend(draft_bank,
                                                                          "instant-draft")
    pair = Pair(target, draft)
    wanted = {plain_alias(p) for p in paths}
    chosen = [p for p in PATHS if not wanted or p[0] in wanted or p[1] in wanted]
    history = (zipf_history(history_tokens, n_vocab)
               if any(p[0] in HISTORY_PATHS - FRESH_PATHS for p in chosen) else None)
    fresh_history = (zipf_history(fresh_history_tokens, n_vocab)
                     if any(p[0] in HISTORY_PATHS & FRESH_PATHS for p in chosen) else None)
    fresh_target = InstantBackend(bank, "fresh-target", shift=0)
    fresh_draft = InstantBackend(bank, "fresh-draft", shift=n_vocab // 2)
    fresh_pair = Pair(fresh_target, fresh_draft) if FRESH_PATHS & {p[0] for p in chosen} else None
    if fresh_pair is not None:
        fresh_pair.knowledge["hybrid"] = COMPUTE_BOUND
    # Text of sixteen letters whose copies lose, and a draft that never agrees with it.
    copy_pair, copy_models = None, None
    if COPY_PATHS & {p[0] for p in chosen}:
        letters = [1 + ord(ch) for ch in COPY_LETTERS]
        copy_models = (CopyRefusingBackend(llm_like_bank(n_vocab, seed=4, tops=letters),
                                           "copy-refusing-target"),
                       InstantBackend(bank, "copy-draft", shift=n_vocab // 2))
        copy_pair = Pair(*copy_models)
    # A prompt that repeats, so prompt lookup finds matches as it would in code.
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"
    samples: dict[tuple[str, str], list[tuple[float, int, int, int, int, int]]] = {}
    for _ in range(repeats + 1):  # the first pass warms caches and calibrations
        for label, drafter, gamma, policy in chosen:
            for mode in modes:
                if label in COPY_PATHS:
                    assert copy_pair is not None and copy_models is not None
                    got = measure(copy_pair, *copy_models, drafter, gamma, policy, MODES[mode],
                                  max_tokens, pairs_text(COPY_LETTERS))
                elif label in FRESH_PATHS:
                    assert fresh_pair is not None
                    got = measure(fresh_pair, fresh_target, fresh_draft, drafter, gamma, policy,
                                  MODES[mode], max_tokens, "a",
                                  fresh_history if label in HISTORY_PATHS else None)
                else:
                    got = measure(pair, target, draft, drafter, gamma, policy, MODES[mode],
                                  max_tokens, prompt,
                                  history if label in HISTORY_PATHS else None)
                samples.setdefault((label, mode), []).append(got)
    rows = []
    for (label, mode), runs in samples.items():
        runs = runs[1:]
        per_token = statistics.median(s / max(t, 1) for s, t, *_ in runs) * 1e3
        per_round = statistics.median(s / max(r, 1) for s, _, r, *_ in runs) * 1e3
        tokens = sum(t for _, t, *_ in runs)
        n_rounds = sum(r for _, _, r, *_ in runs)
        drafted = sum(d for _, _, _, d, _, _ in runs)
        accepted = sum(a for _, _, _, _, a, _ in runs)
        rows.append(OverheadRow(label, mode, per_token, per_round, tokens / max(n_rounds, 1),
                                accepted / drafted if drafted else float("nan")))
    pair.close()
    for other in (fresh_pair, copy_pair):
        if other is not None:
            other.close()
    return rows, (time_history(history, n_vocab) if history is not None else None)

"""The engine's own cost per token: the real `Pair.generate` over backends that answer at once.

On a GPU a token of a 1.5B target takes 3-5 ms, so every millisecond the engine spends around
its decodes (row transforms, draws, the acceptance rule, bookkeeping) is paid on top. Here both
models are `InstantBackend`s: each decode returns precomputed logit rows at the real vocabulary
size, and the time spent inside decode (copying those rows, as llama.cpp's backend copies its
own) is measured and subtracted, so what is left is the engine's time alone.

The rows are shaped like the embedded Qwen2.5 target's (151,936 logits a row: the bulk around
-4 with a spread of 2.5, the top token 16-23 nats up, a few to a few hundred tokens within 10
nats of it, some thousands within 16), drawn once per bank slot; a context picks its slot from
its last two tokens. The draft's bank is the target's with N(0, 0.5) noise added: sampled drafts
are accepted 0.7-0.9 of the time, as the embedded pair's are on code.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.events import DoneEvent, RoundEvent
from engine.generator import GenerationConfig
from engine.pair import Pair
from engine.drafters.base import PLAIN, plain_alias
from engine.sampling import SamplingParams

QWEN_VOCAB = 151_936
BANK = 64

MODES = {
    "greedy": SamplingParams(temperature=0.0, seed=0),
    "T 1.0": SamplingParams(temperature=1.0, seed=0),
    "T 0.7, top-p 0.9": SamplingParams(temperature=0.7, top_p=0.9, seed=0),
    "T 0.8, top-k 40, top-p 0.95, min-p 0.05": SamplingParams(temperature=0.8, top_k=40,
                                                              top_p=0.95, min_p=0.05, seed=0),
}
# (label, drafter, gamma, policy): plain decoding, each drafter at a fixed gamma, and the default
# (hybrid with the adaptive controller, whose calibration here measures backends that cost
# nothing: what is timed is its bookkeeping, not its choices).
PATHS = (("plain", PLAIN, 0, "fixed"), ("draft model, γ 4", "draft", 4, "fixed"),
         ("prompt lookup, γ 4", "lookup", 4, "fixed"), ("hybrid, γ 4", "hybrid", 4, "fixed"),
         ("default: hybrid, adaptive ≤ 8", "hybrid", 8, "adaptive"))


def llm_like_bank(n_vocab: int, seed: int, slots: int = BANK) -> np.ndarray:
    """`[slots, n_vocab]` float32 rows: N(-4, 2.5) logits, a top token at 16-23 and fifteen
    runners-up below it by Exp(2.5) nats."""
    rng = np.random.default_rng(seed)
    bank = rng.standard_normal((slots, n_vocab), dtype=np.float32) * 2.5 - 4.0
    for row in bank:
        top = rng.choice(n_vocab, size=16, replace=False)
        m = rng.uniform(16.0, 23.0)
        row[top] = m - np.concatenate([[0.0], rng.exponential(2.5, size=15)])
    return bank


class InstantBackend:
    """A `Backend` whose decode returns bank rows at once; `decode_s` totals its own time."""

    def __init__(self, bank: np.ndarray, name: str, n_ctx: int = 8192) -> None:
        self.bank = bank
        self.n_vocab = bank.shape[1]
        self.n_ctx = n_ctx
        self.n_batch = 512
        self.name = name
        self.cache: list[int] = []
        self.decode_s = 0.0

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return [1 + b for b in text.encode("utf-8")]

    def token_bytes(self, token: int) -> bytes:
        return bytes([97 + token % 26])

    def is_eog(self, token: int) -> bool:
        return False

    def chat_prompt(self, messages: Sequence[dict]) -> str:
        return "".join(m["content"] for m in messages)

    def decode(self, tokens: Sequence[int], pos: int, rows: Sequence[int]) -> np.ndarray:
        t0 = time.perf_counter()
        self.cache[pos:] = [int(t) for t in tokens]
        slots = [(self.cache[pos + r - 1] * 31 + self.cache[pos + r]) % len(self.bank)
                 if pos + r else 0 for r in rows]
        out = self.bank[slots]
        self.decode_s += time.perf_counter() - t0
        return out

    def truncate(self, n: int) -> None:
        del self.cache[n:]

    def close(self) -> None:
        self.cache.clear()


@dataclass(frozen=True)
class OverheadRow:
    path: str
    mode: str
    ms_per_token: float  # engine time per committed token, median over repeats
    ms_per_round: float
    tokens_per_round: float
    acceptance: float  # accepted / drafted (nan for plain)


def measure(pair: Pair, target: InstantBackend, draft: InstantBackend, drafter: str, gamma: int,
            policy_name: str, params: SamplingParams, max_tokens: int, prompt: str
            ) -> tuple[float, int, int, int, int]:
    """One generation: (engine seconds, committed tokens, rounds, drafted, accepted)."""
    config = GenerationConfig(params=params, gamma=gamma, max_tokens=max_tokens)
    policy = pair.make_policy(policy_name, drafter, gamma) if gamma else None
    target.decode_s = draft.decode_s = 0.0
    t0 = time.perf_counter()
    rounds = drafted = accepted = tokens = 0
    for ev in pair.generate(prompt, config, drafter=drafter, raw=True, policy=policy):
        if isinstance(ev, RoundEvent):
            rounds += 1
            drafted += ev.round.drafted
            accepted += ev.round.accepted
        elif isinstance(ev, DoneEvent):
            tokens = len(ev.tokens)
    wall = time.perf_counter() - t0
    return wall - target.decode_s - draft.decode_s, tokens, rounds, drafted, accepted


def run_overhead(n_vocab: int = QWEN_VOCAB, max_tokens: int = 256, repeats: int = 5,
                 modes: Sequence[str] = tuple(MODES), paths: Sequence[str] = (),
                 noise: float = 0.5) -> list[OverheadRow]:
    """Every path x mode, `repeats` generations each, interleaved so drift hits all alike."""
    bank = llm_like_bank(n_vocab, seed=0)
    draft_bank = bank + np.random.default_rng(1).standard_normal(bank.shape,
                                                                 dtype=np.float32) * noise
    target, draft = InstantBackend(bank, "instant-target"), InstantBackend(draft_bank,
                                                                          "instant-draft")
    pair = Pair(target, draft)
    wanted = {plain_alias(p) for p in paths}
    chosen = [p for p in PATHS if not wanted or p[0] in wanted or p[1] in wanted]
    # A prompt that repeats, so prompt lookup finds matches as it would in code.
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"
    samples: dict[tuple[str, str], list[tuple[float, int, int, int, int]]] = {}
    for _ in range(repeats + 1):  # the first pass warms caches and calibrations
        for label, drafter, gamma, policy in chosen:
            for mode in modes:
                got = measure(pair, target, draft, drafter, gamma, policy, MODES[mode],
                              max_tokens, prompt)
                samples.setdefault((label, mode), []).append(got)
    rows = []
    for (label, mode), runs in samples.items():
        runs = runs[1:]
        per_token = statistics.median(s / max(t, 1) for s, t, *_ in runs) * 1e3
        per_round = statistics.median(s / max(r, 1) for s, _, r, *_ in runs) * 1e3
        tokens = sum(t for _, t, *_ in runs)
        n_rounds = sum(r for _, _, r, *_ in runs)
        drafted = sum(d for *_, d, _ in runs)
        accepted = sum(a for *_, a in runs)
        rows.append(OverheadRow(label, mode, per_token, per_round, tokens / max(n_rounds, 1),
                                accepted / drafted if drafted else float("nan")))
    pair.close()
    return rows


def markdown(rows: Sequence[OverheadRow], n_vocab: int, machine: str) -> str:
    lines = [f"Engine time per committed token (ms), instant backends at {n_vocab:,} tokens; "
             f"{machine}", "",
             "| path | sampling | ms / token | ms / round | tokens / round | acceptance |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        acc = "—" if r.acceptance != r.acceptance else f"{r.acceptance:.2f}"
        lines.append(f"| {r.path} | {r.mode} | {r.ms_per_token:.3f} | {r.ms_per_round:.3f} | "
                     f"{r.tokens_per_round:.2f} | {acc} |")
    return "\n".join(lines)

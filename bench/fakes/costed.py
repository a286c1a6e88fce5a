"""Cost profiles: a pair of fakes on a virtual clock whose decodes cost what a machine's would,
and whose draft agrees with the target at a scripted rate, so a policy's tokens/s on that machine
can be computed exactly, without noise, through the real `Pair.generate`.

The target's greedy answer is scripted by position (a `Script`): a token, and the target's top
probability there. The draft, at each position, agrees with the target when that position's coin
falls under the acceptance rate (else it proposes another token), with a top probability that
tracks the rate. A decode of w tokens costs `cost[w - 1]` virtual ms (bench/fakes/table.py).
`GPU` is the measured GPU profile (bench/benchmark/gpu_profile.py: the H200 run's curve, in its
own ms, tabled to `GPU_WIDTHS`); `CPU` a 2-core CPU as issue 17 measured it, a target token 10 ms.

A fake's text is its token ids written out ("17 203 5"), so a prompt can be any sequence of ids
(a "file" the answer copies, for prompt lookup).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from engine.backend import Part
from engine.pair import Pair
from bench.benchmark.gpu_profile import GpuProfile, measured
from bench.fakes.backend import FakeBackend
from bench.fakes.table import VirtualClock

V = 256
N_POS = 4096


@dataclass(frozen=True)
class Profile:
    """Virtual ms per decode of 1, 2, ... tokens, for the target and the draft; `label` says
    whose costs they are."""
    name: str
    verify: tuple[float, ...]
    draft: tuple[float, ...]
    label: str = ""


def _scaled(ratios: Sequence[float], unit: float) -> tuple[float, ...]:
    return tuple(unit * r for r in ratios)


# The widths the GPU profile is tabled at: 8 sequences' verifies of 64-token copies.
GPU_WIDTHS = 8 * 65


def gpu(profile: GpuProfile) -> Profile:
    """A measured GPU profile as a fake's costs: its ms at widths 1..GPU_WIDTHS."""
    return Profile("gpu", profile.verify_table(GPU_WIDTHS), profile.draft_table(GPU_WIDTHS),
                   profile.description)


# This 2-core CPU as measured (issue 17): widths 2, 3, 4 and 8 cost 1.42, 1.92, 2.85 and 6.1 of
# one token; 5-7 and 9 interpolated.
CPU_RATIOS = (1.0, 1.42, 1.92, 2.85, 3.66, 4.47, 5.29, 6.1, 6.9)

GPU = gpu(measured())
CPU = Profile("cpu", _scaled(CPU_RATIOS, 10.0), _scaled(CPU_RATIOS, 3.5),
              "a 2-core CPU as issue 17 measured it (widths 2, 3, 4, 8), a target token 10 ms")
SLOW_DRAFT = Profile("slow-draft", _scaled(CPU_RATIOS, 10.0), _scaled(CPU_RATIOS, 7.0))


@dataclass(frozen=True)
class Script:
    """Per absolute position n: the target's token, its top probability, whether the draft
    agrees, and the draft's top probability."""
    tokens: np.ndarray
    target_conf: np.ndarray
    agree: np.ndarray
    draft_conf: np.ndarray
    prompt: tuple[int, ...]

    @property
    def prompt_text(self) -> str:
        return " ".join(str(t) for t in self.prompt)


# The runs the profiles are compared on (tests/test_cost_profiles.py asserts the default's bound
# on them; bench/research/cost_profile_table.py tabulates them): answers of TOKENS tokens, greedy,
# gamma up to MAX_GAMMA, against every fixed gamma in FIXED, over three scripts (SEEDS); each case
# a profile, a drafter and the length of the file a copying answer edits (0: none).
TOKENS = 240
MAX_GAMMA = 8
FIXED = range(0, 7)
SEEDS = (0, 1, 2)
FILE = 240
CASES = [(GPU, "hybrid", 0), (CPU, "hybrid", 0), (SLOW_DRAFT, "hybrid", 0),
         (SLOW_DRAFT, "hybrid", FILE), (CPU, "lookup", FILE)]


# Acceptance patterns: the rate at answer position k.
Pattern = Callable[[int], float]
PATTERNS: dict[str, Pattern] = {
    "high": lambda k: 0.9,
    "low": lambda k: 0.3,
    # Easy and hard stretches of 60 tokens, starting easy.
    "shifting": lambda k: 0.95 if (k // 60) % 2 == 0 else 0.2,
}


def script(pattern: Pattern, seed: int, copy: int = 0, prompt_len: int = 8) -> Script:
    """A scripted answer after a random prompt. With `copy` > 0 the prompt is a random "file"
    of that many tokens and the answer copies it from its start, each token replaced by a fresh
    one with probability 1 - rate (an edit), so prompt lookup is what drafts well."""
    rng = np.random.default_rng(seed)
    n_prompt = copy or prompt_len
    fresh = rng.integers(1, V, size=N_POS)
    coins = rng.random(N_POS)
    rate = np.array([pattern(max(n - n_prompt, 0)) for n in range(N_POS)])
    tokens = fresh.copy()
    if copy:
        k = np.arange(N_POS - n_prompt)
        copied = fresh[k % copy]
        tokens[n_prompt:] = np.where(coins[n_prompt:] < rate[n_prompt:], copied,
                                     rng.integers(1, V, size=len(k)))
        tokens[:n_prompt] = fresh[:n_prompt]
        agree = rng.random(N_POS) < rate
    else:
        agree = coins < rate
    return Script(tokens=tokens, target_conf=np.clip(rate, 0.05, 0.99), agree=agree,
                  draft_conf=0.3 + 0.65 * rate, prompt=tuple(int(t) for t in tokens[:n_prompt]))


def _row(top: int, p: float) -> np.ndarray:
    row = np.zeros(V, dtype=np.float32)
    row[top] = np.log(p * (V - 1) / (1.0 - p))
    return row


class ScriptedFake(FakeBackend):
    """The target (`draft` False) or the draft of a `Script`, on a virtual clock."""

    def __init__(self, s: Script, clock: VirtualClock, cost: Sequence[float],
                 draft: bool = False, n_seq: int = 8) -> None:
        super().__init__(n_vocab=V, n_seq=n_seq)
        self.script = s
        self.draft = draft
        self.clock = clock
        self.cost = list(cost)

    def decode(self, tokens: Sequence[int], pos: int, rows: Sequence[int],
               seq: int = 0) -> np.ndarray:
        return self.decode_batch([Part(seq, tokens, pos, rows)])[0]

    def decode_batch(self, parts: Sequence[Part]) -> list[np.ndarray]:
        # One model call, charged at the batch's whole width.
        self.clock.charge(self.cost, sum(len(p.tokens) for p in parts))
        return super().decode_batch(parts)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        words = text.split()
        if words and all(w.isdigit() for w in words):
            return [int(w) for w in words]
        return super().tokenize(text, add_special, parse_special)

    def token_bytes(self, token: int) -> bytes:
        return f"{token} ".encode()

    def _row(self, context: Sequence[int]) -> np.ndarray:
        n = len(context) % N_POS
        s = self.script
        top = int(s.tokens[n])
        if not self.draft:
            return _row(top, float(s.target_conf[n]))
        if not s.agree[n]:
            top = top % (V - 1) + 1
        return _row(top, float(s.draft_conf[n]))


def scripted_pair(profile: Profile, s: Script,
                  parallel: int = 1) -> tuple[Pair, VirtualClock]:
    """The pair of `s` on `profile`'s clock, with `parallel` slots (engine/slots.py)."""
    clock = VirtualClock()
    n_seq = max(8, parallel + 1)
    pair = Pair(ScriptedFake(s, clock, profile.verify, n_seq=n_seq),
                ScriptedFake(s, clock, profile.draft, draft=True, n_seq=n_seq), clock=clock.now,
                parallel=parallel)
    return pair, clock

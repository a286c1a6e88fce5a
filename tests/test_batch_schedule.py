"""A sampled draft's length follows its own draws (its chain stops read them); in a shared batch
that length must not decide which step its verify lands in, nor that step's width, or the row
judging a drafted token would depend on that token through the batch (engine/batch_step.py,
docs/EXACTNESS.md).

The case: sequence A drafts by sampling and stops where its chain of draws gets unlikely;
sequence B drafts greedily beside it on a draft model whose rows depend on the width of the
draft call (as llama.cpp's do): alone in a call, B's rows are flat and it stops. Before the fix,
A's early stop left B alone in the later draft calls, B drafted less, and the target call that
verified A's draft was narrower: its width followed A's first drawn token. With A's idle draft
decodes, every draft call keeps its shape, B drafts the same, and A's verify call has one width
whatever A drew.
"""
from __future__ import annotations

import threading
from typing import Sequence

import numpy as np

from tests.fakes.threads import run_each
from bench.fakes.table import TableFake
from engine.backend import Part
from engine.batch_step import BatchStep
from engine.control.policy import FixedGamma
from engine.drafters.draft_model import DraftModelDrafter
from engine.events import DoneEvent, RoundEvent
from engine.generation_config import GenerationConfig
from engine.generator import generate
from engine.rng import Rng
from engine.sampling import SamplingParams
from engine.seq_backend import SeqBackend
from engine.session import Session
from tests.exact_law import EnumeratingRng

PROMPTS = ([0, 1, 2, 3], [5, 4, 3, 2])
SAMPLED = SamplingParams(temperature=1.0)
GREEDY = SamplingParams(temperature=0.0)
GAMMA = 3


class WidthDraft(TableFake):
    """A draft whose rows depend on its call's width: sharp in a call of several sequences,
    flat (every token alike) in a call of one."""

    def decode_batch(self, parts: Sequence[Part]) -> list[np.ndarray]:
        rows = super().decode_batch(parts)
        return [r * 4.0 if len(parts) > 1 else np.zeros_like(r) for r in rows]


def verify_widths(path: int) -> tuple[list[int], tuple, int]:
    """The width of every target call holding A's parts, with A's first draw taking option
    `path` (B greedy beside it); both answers; and the tokens A's first round drafted."""
    target = TableFake(seed=1)
    draft = WidthDraft(seed=1, noise=0.3)
    step = BatchStep(verifier=target)
    out: list = [None, None]
    drafted: list[int] = []
    joined = threading.Barrier(2)

    def run(k: int, errors: list[BaseException]) -> None:
        try:
            with step.sequence():
                joined.wait()
                drafter = DraftModelDrafter(SeqBackend(draft, k + 1, step), p_min=0.0,
                                            chain_min=0.5)
                config = GenerationConfig(params=SAMPLED if k == 0 else GREEDY, gamma=GAMMA,
                                          max_tokens=GAMMA + 1)
                rng = EnumeratingRng([path]) if k == 0 else Rng(0)
                events = generate(Session(SeqBackend(target, k + 1, step)), drafter, PROMPTS[k],
                                  config, FixedGamma(GAMMA), rng=rng, mates=step)
                for event in events:
                    if isinstance(event, RoundEvent) and k == 0 and not drafted:
                        drafted.append(event.round.drafted)
                    if isinstance(event, DoneEvent):
                        out[k] = event.tokens
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread
            errors.append(exc)

    run_each(run, 2)
    widths = [sum(n for _, n in b) for b in target.batches if any(s == 1 for s, _ in b)]
    return widths, tuple(out), drafted[0]


def test_a_sampled_drafts_verify_width_does_not_follow_its_draws():
    runs = {path: verify_widths(path) for path in range(8)}
    # Some first draws stop A's chain at once and others let it run: the case is live.
    assert len({drafted for _, _, drafted in runs.values()}) > 1
    # The prefills come first; the call after them verifies A's first draft.
    widths = {path: w[1] for path, (w, _, _) in runs.items()}
    assert len(set(widths.values())) == 1, widths


def test_an_idle_draft_leaves_the_cache_as_a_short_draft_does():
    """A's idle decodes are dropped again: its answer is the one its draws give, and B's is
    the same whatever A drew."""
    answers = {path: verify_widths(path)[1] for path in range(8)}
    assert len({b for _, b in answers.values()}) == 1
    assert len({a for a, _ in answers.values()}) > 1

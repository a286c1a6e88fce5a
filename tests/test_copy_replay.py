"""bench/research/copy_replay.py on synthetic traces: whole-file edits replayed through the real
`Pair.generate` on a verify curve to 65, timed on a virtual clock."""
from __future__ import annotations

import pytest

from bench.research import copy_replay

# A CPU-shaped curve: a verify of w tokens costs w below 8, then 0.4 a token more.
VERIFY = {1: 10.0, 2: 20.0, 4: 40.0, 8: 80.0, 16: 112.0, 32: 176.0, 64: 304.0, 65: 308.0}
COSTS = copy_replay.costs_of(VERIFY, {1: 3.0, 16: 10.0})


def edit(n: int, changed: set[int]) -> dict:
    """A file of `n` tokens in the prompt, answered with the tokens at `changed` replaced; the
    draft always wrong, so that only copies pay."""
    file = list(range(100, 100 + n))
    gen = [t + 1000 if i in changed else t for i, t in enumerate(file)]
    return {"id": "e", "cat": "file-editing", "toks": [1, 2, 3] + file + [4, 5], "gen": gen,
            "tconf": [0.99] * (n + 1), "dargmax": [7] * (n + 1), "dconf": [0.9] * (n + 1),
            "pred": file}


def test_plain_decoding_replays_at_one_and_lookup_copies_a_verbatim_answer():
    rec = edit(120, set())
    # A verbatim answer: lookup learns its copies by watching (the first, of 64 tokens), then
    # copies at length, at every longer match, from that one copy's evidence.
    got = copy_replay.replay_answer(rec, COSTS, "lookup", False, None, max_tokens=120)
    assert got.speedup > 1.2
    assert got.accepted == got.drafted > 40
    # The same answer with every drafted token rejected cannot pay: an edit in every token.
    every = edit(120, set(range(120)))
    none = copy_replay.replay_answer(every, COSTS, "lookup", False, None, max_tokens=120)
    assert none.accepted == 0 and none.speedup == pytest.approx(1.0, abs=0.05)


def test_a_suite_replay_carries_the_evidence_from_answer_to_answer():
    rec = edit(120, {40, 80})
    runs = copy_replay.replay_suite([rec, dict(rec, id="f")], COSTS, "hybrid", False,
                                    max_tokens=120)
    # The first answer watches its copies; the second starts from what they taught and
    # copies from its opening.
    assert runs["e"].drafted < runs["f"].drafted
    assert runs["f"].speedup > runs["e"].speedup
    assert all(r[3] in ("plain", "prompt-lookup") for r in runs["f"].rounds)

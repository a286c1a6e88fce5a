"""Slots on the embedded pair: greedy answers decoded together in shared llama.cpp batches
(several sequence ids in one decode, one unified cache) equal the answers each gets alone, up
to the near-tie rule (bench/exactness/greedy.py: a wider batch moves a logit by its numerics,
never past a real gap)."""
from __future__ import annotations

import threading

import pytest

from bench.exactness.greedy import check_near_tie
from engine.backend import ModelConfig
from engine.control.registry import make_policy
from engine.events import DoneEvent
from engine.generation_config import GenerationConfig
from engine.llama.backend import LlamaBackend
from engine.llama.quiet import quiet_llama
from engine.pair import Pair
from engine.sampling import SamplingParams

pytestmark = [pytest.mark.real, pytest.mark.long]

PROMPTS = ["def fibonacci(n):\n    ", "The capital of France is", "import numpy as np\n\n# "]
GREEDY = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=3, max_tokens=16)


def answer(pair: Pair, prompt: str, drafter: str) -> tuple[int, ...]:
    policy = None if drafter == "plain" else make_policy("fixed", 3)
    events = list(pair.generate(prompt, GREEDY, drafter=drafter, raw=True, policy=policy))
    assert isinstance(events[-1], DoneEvent)
    return events[-1].tokens


@pytest.mark.parametrize("drafter", ["draft", "plain"])
def test_greedy_answers_in_one_batch_equal_their_answers_alone(embedded_paths, drafter):
    quiet_llama()
    n = len(PROMPTS)
    target, draft = (LlamaBackend(ModelConfig(str(p), n_ctx=512, n_threads=2, n_seq=n + 1))
                     for p in embedded_paths)
    pair = Pair(target, draft, parallel=n)
    try:
        alone = [answer(pair, p, drafter) for p in PROMPTS]
        got: list = [None] * n
        start = threading.Barrier(n)

        def run(i: int) -> None:
            start.wait()
            got[i] = answer(pair, PROMPTS[i], drafter)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert pair.slots is not None and pair.slots.step.steps > 0
        for prompt, a, b in zip(PROMPTS, alone, got):
            check_near_tie(pair.target, pair.target.backend.tokenize(prompt), a, b)
    finally:
        pair.close()

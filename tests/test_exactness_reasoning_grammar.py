"""Exact enumeration under a JSON grammar led by a reasoning model's thinking
(app/runtime/reasoning.py `after_thinking`): free thought up to `</think>`, then the JSON object.
The law of the speculative answer over every random choice equals plain constrained sampling's
law (the target's rows masked by the led grammar's state) to 1e-9, for the draft model and
lookup, sampled and greedy, with the tags as control tokens (Qwen3's, as llama.cpp reads them)
or as text, and with the thinking opened by the prompt (DeepSeek-R1's) or by the answer; the
negative control, a draft whose q is not masked (only p is), must fail.

The vocabulary: thought text `t`, `<think>`, `</think>`, a newline, `{`, `"a":1`, `}` and the
end. The target's rows favour the next token of `<think> t </think> \\n { "a":1 } <end>` and
`t` (top-k 2 keeps both), so answers think for a while, close, and write the object.
"""
from __future__ import annotations

import numpy as np
import pytest

from app.runtime.reasoning import Thinking, after_thinking
from engine.backend import TokenTable
from engine.drafters.draft_model import DraftModelDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.events import DoneEvent
from engine.generation_config import GenerationConfig
from engine.generator import generate
from engine.grammar.llg import compile_grammar
from engine.grammar.spec import JSON_OBJECT, GrammarSpec
from engine.rng import Rng
from engine.sampling import SamplingParams
from engine.session import Session
from bench.fakes.table import VirtualClock
from tests.exact_law import exact_law, total_variation
from tests.grammar_fakes import SpelledTable, constrained_law

PIECES = [b"t", b"<think>", b"</think>", b"\n", b"{", b'"a":1', b"}", b""]
T, OPEN, CLOSE, NEWLINE, LBRACE, PAIR, RBRACE, END = range(8)
NEXT = {T: CLOSE, OPEN: T, CLOSE: NEWLINE, NEWLINE: LBRACE, LBRACE: PAIR, PAIR: RBRACE,
        RBRACE: END, END: T}
N = 5
# An object already in the prompt, for lookup to copy from.
PROMPT = [LBRACE, PAIR, RBRACE, T, NEWLINE]
SAMPLINGS = {"T=1 top-k 2": SamplingParams(temperature=1.0, top_k=2),
             "greedy": SamplingParams(temperature=0.0)}
# (tags as control tokens, the prompt opened the thinking)
CASES = {"control tags": (True, False), "text tags": (False, False),
         "prompt-opened": (True, True)}


class ThoughtFake(SpelledTable):
    """A vocabulary spelling a thought and an object; its rows lean to NEXT[last] and `t`."""
    PIECES = tuple(PIECES)
    END = END
    control_tags = True

    def __init__(self, noise: float = 0.0, **kw) -> None:
        super().__init__(n_vocab=len(PIECES), seed=5, noise=noise, eog=END, **kw)
        for last, nxt in NEXT.items():
            self.table[:, last, nxt] += 6.0
            self.table[:, last, T] += 5.0

    def token_table(self) -> TokenTable:
        table = super().token_table()
        tags = {OPEN, CLOSE} if self.control_tags else set()
        return TokenTable(table.pieces, table.control | tags, table.eos)


def led_grammar(backend, opened: bool):
    spec = after_thinking(GrammarSpec(JSON_OBJECT), Thinking(opened), backend)
    assert spec is not None and spec.lead
    return compile_grammar(spec, backend)


def fake(case: str, **kw) -> ThoughtFake:
    backend = ThoughtFake(**kw)
    backend.control_tags = CASES[case][0]
    return backend


class UnmaskedDraft(DraftModelDrafter):
    """Says it masks its rows but drafts from them unmasked: only p is constrained."""

    def propose(self, plan, gamma, params, rng, keep=None, guide=None):
        return super().propose(plan, gamma, params, rng, keep)


def draft_model(case, clock):
    return DraftModelDrafter(fake(case, noise=1.5, clock=clock))


def lookup(case, clock):
    return PromptLookupDrafter(ngram_max=2, is_eog=lambda t: t == END)


def laws(case: str, sampling: str, make_drafter) -> tuple[dict, dict, list[int]]:
    """(speculative law, constrained law, [leaves that drafted, leaves that closed the
    thought and began the object])."""
    params, opened = SAMPLINGS[sampling], CASES[case][1]
    seen = [0, 0]

    def run(rng: Rng):
        clock = VirtualClock()
        target = Session(fake(case, clock=clock))
        config = GenerationConfig(params=params, gamma=2, max_tokens=N,
                                  grammar=led_grammar(target.backend, opened))
        events = list(generate(target, make_drafter(case, clock), PROMPT, config, rng=rng,
                               clock=clock.now))
        done = events[-1]
        assert isinstance(done, DoneEvent)
        seen[0] += done.stats.drafted_tokens > 0
        seen[1] += CLOSE in done.tokens and LBRACE in done.tokens
        return done.tokens

    spec = exact_law(run)
    target = fake(case)
    want = constrained_law(target._row, PROMPT, params, N,
                           start=led_grammar(target, opened).start, end=END)
    return spec, want, seen


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_lead_is_free_thought_then_the_close_then_the_object(case):
    control, opened = CASES[case]
    c = led_grammar(fake(case), opened).start()
    if not opened:
        # The answer opens the thinking, or is the object at once.
        assert set(c.mask().ids().tolist()) == {OPEN, LBRACE}
        assert c.consume([OPEN]) == 1
    # Thought text, or the close (not the end: the object must come).
    assert set(c.mask().ids().tolist()) >= {T, CLOSE} and END not in c.mask().ids().tolist()
    assert c.consume([T, T, CLOSE]) == 3
    # After the close: whitespace, or the object; no more thought.
    assert set(c.mask().ids().tolist()) == {NEWLINE, LBRACE}
    assert c.consume([NEWLINE, LBRACE, PAIR, RBRACE]) == 4
    assert set(c.mask().ids().tolist()) == {END}


@pytest.mark.parametrize("sampling", sorted(SAMPLINGS))
@pytest.mark.parametrize("drafter", [draft_model, lookup], ids=["draft-model", "lookup"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_speculation_under_the_grammar_after_thinking_is_exact(case, drafter, sampling):
    spec, want, seen = laws(case, sampling, drafter)
    assert sum(spec.values()) == pytest.approx(1.0, abs=1e-12)
    assert total_variation(spec, want) < 1e-9
    assert seen[0] > 0
    if sampling != "greedy":
        # Sampled, the thought both goes on and closes into the object.
        assert seen[1] > 0 and 0 < sum(p for out, p in want.items() if LBRACE in out) < 1


@pytest.mark.parametrize("case", sorted(CASES))
def test_masking_only_p_under_the_grammar_after_thinking_is_caught(case):
    spec, want, seen = laws(case, "T=1 top-k 2", lambda c, clock: UnmaskedDraft(
        fake(c, noise=1.5, clock=clock)))
    assert seen[0] > 0
    assert total_variation(spec, want) > 1e-5


def test_the_rows_lean_as_the_docstring_says():
    row = ThoughtFake()._row([T, LBRACE])
    assert set(np.argsort(row)[-2:].tolist()) == {PAIR, T}

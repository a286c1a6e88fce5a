"""Exact enumeration under the lazy tool grammar of `tool_choice: "auto"`
(app/runtime/tool_grammar.py): free text until the syntax's trigger, then a call to the tool
offered and nothing after it. The law of the speculative answer over every random choice equals
plain constrained sampling's law (the target's rows masked by the lazy grammar's state) to 1e-9,
for the draft model and lookup, sampled and greedy; the negative control, a draft whose q is not
masked (only p is), must fail.

The vocabulary spells one call in six tokens, `<c>` `{"name": "f"` `, "arguments": {}` `}` `</c>`
and the end, with free text `a` and a newline. The target's rows favour the next token of that
call and `a` (top-k 2 keeps both), so answers wander in text, start the call, and finish it.
"""
from __future__ import annotations

import numpy as np
import pytest

from app.runtime.tool_calls import AUTO, Function, ToolChoice, Tools
from app.runtime.tool_grammar import tool_grammar
from app.runtime.tool_syntax import Form, Syntax
from engine.drafters.draft_model import DraftModelDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.events import DoneEvent
from engine.generation_config import GenerationConfig
from engine.generator import generate
from engine.grammar.llg import compile_grammar
from engine.rng import Rng
from engine.sampling import SamplingParams
from engine.session import Session
from bench.fakes.table import VirtualClock
from tests.exact_law import exact_law, total_variation
from tests.grammar_fakes import SpelledTable, constrained_law

PIECES = [b"a", b"<c>", b'{"name": "f"', b', "arguments": {}', b"}", b"</c>", b"\n", b""]
A, OPEN, NAME, ARGS, BRACE, CLOSE, NEWLINE, END = range(8)
# Each token's successor on the way through one call.
NEXT = {A: OPEN, OPEN: NAME, NAME: ARGS, ARGS: BRACE, BRACE: CLOSE, CLOSE: END, NEWLINE: OPEN,
        END: A}
SYNTAX = Syntax("test", (Form("c", call_open=("<c>",), call_close=("</c>",)),))
TOOLS = Tools((Function("f", {"type": "object", "properties": {},
                              "additionalProperties": False}),), ToolChoice(AUTO), False)
N = 5
PROMPT = [A, NEWLINE]
SAMPLINGS = {"T=1 top-k 2": SamplingParams(temperature=1.0, top_k=2),
             "greedy": SamplingParams(temperature=0.0)}


class CallFake(SpelledTable):
    """A vocabulary spelling the call above; its rows lean to NEXT[last] and `a`."""
    PIECES = tuple(PIECES)
    END = END

    def __init__(self, noise: float = 0.0, **kw) -> None:
        super().__init__(n_vocab=len(PIECES), seed=3, noise=noise, eog=END, **kw)
        for last, nxt in NEXT.items():
            self.table[:, last, nxt] += 6.0
            self.table[:, last, A] += 5.0


def lazy_grammar(backend):
    spec = tool_grammar(SYNTAX, TOOLS, {})
    assert spec is not None
    return compile_grammar(spec, backend)


class UnmaskedDraft(DraftModelDrafter):
    """Says it masks its rows but drafts from them unmasked: only p is constrained."""

    def propose(self, plan, gamma, params, rng, keep=None, guide=None):
        return super().propose(plan, gamma, params, rng, keep)


def draft_model(clock):
    return DraftModelDrafter(CallFake(noise=1.5, clock=clock))


def lookup(clock):
    return PromptLookupDrafter(ngram_max=2, is_eog=lambda t: t == END)


def laws(sampling: str, make_drafter) -> tuple[dict, dict, list[int]]:
    """(speculative law, constrained law, [leaves that drafted, leaves that called f])."""
    params = SAMPLINGS[sampling]
    seen = [0, 0]

    def run(rng: Rng):
        clock = VirtualClock()
        target = Session(CallFake(clock=clock))
        config = GenerationConfig(params=params, gamma=2, max_tokens=N,
                                  grammar=lazy_grammar(target.backend))
        events = list(generate(target, make_drafter(clock), PROMPT, config, rng=rng,
                               clock=clock.now))
        done = events[-1]
        assert isinstance(done, DoneEvent)
        seen[0] += done.stats.drafted_tokens > 0
        seen[1] += NAME in done.tokens
        return done.tokens

    spec = exact_law(run)
    fake = CallFake()
    want = constrained_law(fake._row, PROMPT, params, N, start=lazy_grammar(fake).start, end=END)
    return spec, want, seen


def test_the_lazy_grammar_is_free_until_the_trigger_then_holds_the_call():
    c = lazy_grammar(CallFake()).start()
    assert set(c.mask().ids().tolist()) >= {A, OPEN, NEWLINE}
    assert c.consume([A]) == 1 and END in c.mask().ids().tolist()  # text may end the answer
    assert c.consume([OPEN]) == 1 and c.consume([NAME]) == 1
    # From the trigger on: the call's own tokens (whitespace between them is the model's
    # choice), then its end, and nothing after it.
    for token in (ARGS, BRACE, CLOSE):
        assert set(c.mask().ids().tolist()) == {token, NEWLINE}
        assert c.consume([token]) == 1
    assert set(c.mask().ids().tolist()) == {END, NEWLINE}


@pytest.mark.parametrize("sampling", sorted(SAMPLINGS))
@pytest.mark.parametrize("drafter", [draft_model, lookup], ids=["draft-model", "lookup"])
def test_speculation_under_the_lazy_tool_grammar_is_exact(drafter, sampling):
    spec, want, seen = laws(sampling, drafter)
    assert sum(spec.values()) == pytest.approx(1.0, abs=1e-12)
    assert total_variation(spec, want) < 1e-9
    assert seen[0] > 0
    # Sampled, both kinds of answer have mass: text only, and text then the call.
    if sampling != "greedy":
        assert seen[1] > 0 and 0 < sum(p for out, p in want.items() if NAME in out) < 1


def test_masking_only_p_under_the_lazy_grammar_is_caught():
    spec, want, seen = laws("T=1 top-k 2", lambda clock: UnmaskedDraft(
        CallFake(noise=1.5, clock=clock)))
    assert seen[0] > 0
    # Small (before the trigger the grammar allows nearly everything, so q's mask matters only
    # inside the call), but orders of magnitude above the exact paths' float rounding.
    assert total_variation(spec, want) > 1e-5


def test_the_rows_lean_as_the_docstring_says():
    row = CallFake()._row([A, NEWLINE])
    assert set(np.argsort(row)[-2:].tolist()) == {A, OPEN}

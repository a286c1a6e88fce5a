"""The constraint's own cost per token (issue 37): plain decoding, the draft model and the default,
free and under a JSON schema of the kind agents send, over backends that spell text with a real
vocabulary, with the time inside llguidance measured apart."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from bench.fakes.spelled import SpelledBackend, Spelling
from bench.overhead.banks import llm_like_bank
from bench.overhead.engine_time import MODES, measure
from engine.drafters.base import PLAIN
from engine.grammar.guide import CompiledGrammar, Constraint
from engine.grammar.llg import compile_grammar
from engine.grammar.mask import TokenMask
from engine.grammar.spec import GrammarSpec
from engine.pair import Pair

# The constrained paths' schema: a tool call's arguments and a list of extracted records, with
# the enums, numbers, arrays and bounded strings agents send (assets/prompts/structured-v1.jsonl).
# Strings are bounded so that random rows close them: the answer keeps walking the structure;
# at least 32 attendees, so every answer runs to the token budget and each path times the same
# length of text.
OVERHEAD_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"const": "create_event"},
        "arguments": {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 24},
                "duration_minutes": {"type": "integer"},
                "reminders": {"type": "array", "items": {
                    "type": "object",
                    "properties": {"method": {"enum": ["email", "popup"]},
                                   "minutes_before": {"type": "integer"}},
                    "required": ["method", "minutes_before"], "additionalProperties": False}},
                "attendees": {"type": "array", "minItems": 32, "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string", "maxLength": 16},
                                   "role": {"enum": ["chair", "guest", "optional"]},
                                   "score": {"type": "number"}, "confirmed": {"type": "boolean"}},
                    "required": ["name", "role", "score", "confirmed"],
                    "additionalProperties": False}}},
            "required": ["title", "duration_minutes", "reminders", "attendees"],
            "additionalProperties": False}},
    "required": ["name", "arguments"], "additionalProperties": False}
GRAMMAR_PATH = "json"
# (label, drafter, gamma, policy): each runs free and under the schema.
GRAMMAR_PATHS = (("plain", PLAIN, 0, "fixed"), ("draft model, γ 4", "draft", 4, "fixed"),
                 ("default: hybrid, adaptive ≤ 8", "hybrid", 8, "adaptive"))
GRAMMAR_MODES = ("greedy", "T 0.7, top-p 0.9")


class TimedConstraint:
    """A `Constraint` that adds the thread time spent inside the one it wraps to `clock[0]`."""

    def __init__(self, inner: Constraint, clock: list[float]) -> None:
        self.inner = inner
        self.n_vocab = inner.n_vocab
        self.clock = clock

    def mask(self) -> TokenMask:
        t0 = time.thread_time()
        out = self.inner.mask()
        self.clock[0] += time.thread_time() - t0
        return out

    def consume(self, tokens: Sequence[int]) -> int:
        t0 = time.thread_time()
        out = self.inner.consume(tokens)
        self.clock[0] += time.thread_time() - t0
        return out

    def rollback(self, n: int) -> None:
        t0 = time.thread_time()
        self.inner.rollback(n)
        self.clock[0] += time.thread_time() - t0


class TimedGrammar:
    """A `CompiledGrammar` whose constraints time themselves into `clock[0]` (seconds)."""

    def __init__(self, inner: CompiledGrammar) -> None:
        self.inner = inner
        self.clock = [0.0]

    def start(self) -> Constraint:
        t0 = time.thread_time()
        constraint = self.inner.start()
        self.clock[0] += time.thread_time() - t0
        return TimedConstraint(constraint, self.clock)


@dataclass(frozen=True)
class GrammarOverheadRow:
    path: str
    mode: str
    free_ms_per_token: float  # engine time per token without a grammar (median over repeats)
    ms_per_token: float  # the same under the schema
    llguidance_ms_per_token: float  # of which inside llguidance's matcher
    forced_share: float  # forced tokens / committed tokens under the schema
    tokens_per_round: float  # under the schema
    answer_tokens: float  # mean tokens an answer under the schema ran to


def run_grammar_overhead(spelling: Spelling, max_tokens: int = 256, repeats: int = 5,
                         modes: Sequence[str] = GRAMMAR_MODES, noise: float = 0.5,
                         schema: dict = OVERHEAD_SCHEMA) -> list[GrammarOverheadRow]:
    """Every constrained path x mode, free and under `schema`, `repeats` generations each,
    interleaved; the first pass warms caches and is not counted."""
    n_vocab = spelling.n_vocab
    bank = llm_like_bank(n_vocab, seed=0)
    draft_bank = bank + np.random.default_rng(1).standard_normal(bank.shape,
                                                                 dtype=np.float32) * noise
    target = SpelledBackend(bank, "instant-target", spelling)
    draft = SpelledBackend(draft_bank, "instant-draft", spelling)
    pair = Pair(target, draft)
    grammar = TimedGrammar(compile_grammar(GrammarSpec.schema(schema), target))
    prompt = "Call create_event for the design review as JSON:"
    free: dict[tuple[str, str], list[float]] = {}
    held: dict[tuple[str, str], list[tuple[float, float, int, int, int]]] = {}
    for _ in range(repeats + 1):
        for label, drafter, gamma, policy in GRAMMAR_PATHS:
            for mode in modes:
                s, t, *_ = measure(pair, target, draft, drafter, gamma, policy, MODES[mode],
                                   max_tokens, prompt)
                free.setdefault((label, mode), []).append(s / max(t, 1))
                grammar.clock[0] = 0.0
                s, t, r, _, _, f = measure(pair, target, draft, drafter, gamma, policy,
                                           MODES[mode], max_tokens, prompt, grammar=grammar)
                held.setdefault((label, mode), []).append((s, grammar.clock[0], t, r, f))
    rows = []
    for (label, mode), runs in held.items():
        runs = runs[1:]  # (engine s, llguidance s, tokens, rounds, forced)
        tokens = sum(t for _, _, t, _, _ in runs)
        rows.append(GrammarOverheadRow(
            label, mode, statistics.median(free[(label, mode)][1:]) * 1e3,
            statistics.median(s / max(t, 1) for s, _, t, _, _ in runs) * 1e3,
            statistics.median(g / max(t, 1) for _, g, t, _, _ in runs) * 1e3,
            sum(f for _, _, _, _, f in runs) / max(tokens, 1),
            tokens / max(sum(r for _, _, _, r, _ in runs), 1), tokens / len(runs)))
    pair.close()
    return rows

"""The engine's own cost per token: the real `Pair.generate` over backends that answer at once.

On a GPU a token of a 1.5B target takes 3-5 ms, so every millisecond the engine spends around
its decodes (row transforms, draws, the acceptance rule, bookkeeping) is paid on top. Here both
models are `InstantBackend`s: each decode returns precomputed logit rows at the real vocabulary
size, and the time spent inside decode (copying those rows, as llama.cpp's backend copies its
own) is measured and subtracted, so what is left is the engine's time alone. Times are the
thread's CPU time, so other programs on a shared machine do not count in them.

The rows are shaped like the embedded Qwen2.5 target's (151,936 logits a row: the bulk around
-4 with a spread of 2.5, the top token 16-23 nats up, a few to a few hundred tokens within 10
nats of it, some thousands within 16), drawn once per bank slot; a context picks its slot from
its last two tokens. The draft's bank is the target's with N(0, 0.5) noise added: sampled drafts
are accepted 0.7-0.9 of the time, as the embedded pair's are on code.

The "fresh text" paths are where nothing drafts: each row is rolled by an offset of its position,
so the text never repeats (prompt lookup and the history find nothing to copy), and the draft's
rows by another, so it never agrees with the target (a draft that never pays). What the default
costs there over plain decoding is its bookkeeping alone (issue 35's budget: 0.1 ms a token, 0.2
with a history of 2,000,000 tokens).

The "losing copies" paths are where a copy is on offer nearly every round and always loses: the
text is made of sixteen letters, the prompt holds every pair of them (so the text's last two
tokens always occurred before, and prompt lookup has a copy), and the target never continues a
pair as it was continued before (`CopyRefusingBackend`), so every copy's first token is
rejected. The default should learn that these copies lose and stop drafting them; what it costs
there over plain decoding is its bookkeeping with a copy on offer (issue 35).

The constrained paths (issue 37) run plain decoding, the draft model and the default twice over
the same banks, free and under a JSON schema of the kind agents send (`OVERHEAD_SCHEMA`): the
difference is the constraint's own cost per token, masks on p and q, forced chains and the
matcher's walk over drafts, with the time inside llguidance (the masks' computation, consuming
and rolling back tokens) measured apart. A grammar needs backends that spell text with their own
tokens (llguidance forces canonical tokenizations through `tokenize`): the real Qwen2.5
vocabulary read from a GGUF when one is given (`qwen_spelling`), else a byte-level table padded
to the vocabulary size with distinct 2-3 byte pieces (`byte_spelling`); the report names which.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from engine.backend import TokenTable
from engine.events import DoneEvent, RoundEvent
from engine.generation_config import GenerationConfig
from engine.grammar.guide import CompiledGrammar, Constraint
from engine.grammar.llg import compile_grammar
from engine.grammar.mask import TokenMask
from engine.grammar.spec import GrammarSpec
from engine.llama.backend import Vocabulary
from engine.pair import Pair
from engine.drafters.base import PLAIN, plain_alias
from engine.drafters.history_index import HistoryIndex
from engine.drafters.suffix import MIN_SHARE, SUFFIX
from engine.sampling import SamplingParams

QWEN_VOCAB = 151_936
BANK = 64
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
# Paths over the backends whose copies lose.
COPY_PATHS = {p[0] for p in PATHS if COPY_LABEL in p[0]}


def llm_like_bank(n_vocab: int, seed: int, slots: int = BANK,
                  tops: Sequence[int] | None = None) -> np.ndarray:
    """`[slots, n_vocab]` float32 rows: N(-4, 2.5) logits, a top token at 16-23 and fifteen
    runners-up below it by Exp(2.5) nats; with `tops` (sixteen ids), those are the sixteen,
    in an order of each row's own."""
    rng = np.random.default_rng(seed)
    bank = rng.standard_normal((slots, n_vocab), dtype=np.float32) * 2.5 - 4.0
    for row in bank:
        top = (rng.choice(n_vocab, size=16, replace=False) if tops is None
               else rng.permutation(np.asarray(tops)))
        m = rng.uniform(16.0, 23.0)
        row[top] = m - np.concatenate([[0.0], rng.exponential(2.5, size=15)])
    return bank


class InstantBackend:
    """A `Backend` whose decode returns bank rows at once; `decode_s` totals its own time.
    With `shift`, the row at position p is rolled by p * 7919 + shift entries, so the text
    never repeats and backends of different shifts never agree."""

    def __init__(self, bank: np.ndarray, name: str, n_ctx: int = 8192,
                 shift: int | None = None) -> None:
        self.bank = bank
        self.shift = shift
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

    def token_table(self) -> TokenTable:
        return TokenTable(tuple(self.token_bytes(t) for t in range(self.n_vocab)), frozenset(), -1)

    def chat_prompt(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str:
        return "".join(m["content"] for m in messages)

    def decode(self, tokens: Sequence[int], pos: int, rows: Sequence[int]) -> np.ndarray:
        t0 = time.thread_time()
        self.cache[pos:] = [int(t) for t in tokens]
        slots = [(self.cache[pos + r - 1] * 31 + self.cache[pos + r]) % len(self.bank)
                 if pos + r else 0 for r in rows]
        if self.shift is None:
            out = self.bank[slots]
        else:
            out = np.empty((len(slots), self.n_vocab), dtype=self.bank.dtype)
            for i, (slot, r) in enumerate(zip(slots, rows)):
                k = ((pos + r) * 7919 + self.shift) % self.n_vocab
                out[i, k:] = self.bank[slot, :self.n_vocab - k]
                out[i, :k] = self.bank[slot, self.n_vocab - k:]
        self.decode_s += time.thread_time() - t0
        return out

    def truncate(self, n: int) -> None:
        del self.cache[n:]

    def close(self) -> None:
        self.cache.clear()


def pairs_text(letters: str) -> str:
    """A de Bruijn sequence of order 2 over `letters`: every ordered pair of them (a letter
    twice included) occurs once, in len(letters) ** 2 + 1 letters.

    >>> pairs_text("ab")
    'aabba'
    """
    k = len(letters)
    seq: list[int] = []
    a = [0] * 3

    def db(t: int, p: int) -> None:
        if t > 2:
            if 2 % p == 0:
                seq.extend(a[1:p + 1])
            return
        a[t] = a[t - p]
        db(t + 1, p)
        for j in range(a[t - p] + 1, k):
            a[t] = j
            db(t + 1, t)

    db(1, 1)
    return "".join(letters[i] for i in seq) + letters[0]


class CopyRefusingBackend(InstantBackend):
    """An `InstantBackend` that never continues a pair of tokens as it was continued before:
    each row pushes the tokens that followed earlier occurrences of its context's last two
    tokens down into the bulk (`floor`), so a copy of what followed a match of two or more
    tokens is always wrong at its first token, in every sampling mode."""

    floor = -20.0

    def decode(self, tokens: Sequence[int], pos: int, rows: Sequence[int]) -> np.ndarray:
        out = super().decode(tokens, pos, rows)
        t0 = time.thread_time()
        text = np.asarray(self.cache, dtype=np.int64)
        for i, r in enumerate(rows):
            c = text[:pos + r + 1]
            if len(c) >= 3:
                out[i, c[2:][(c[:-2] == c[-2]) & (c[1:-1] == c[-1])]] = self.floor
        self.decode_s += time.thread_time() - t0
        return out


@dataclass(frozen=True)
class OverheadRow:
    path: str
    mode: str
    ms_per_token: float  # engine time per committed token, median over repeats
    ms_per_round: float
    tokens_per_round: float
    acceptance: float  # accepted / drafted (nan for plain)


class FrozenHistory(HistoryIndex):
    """A history that keeps what it holds: the overhead runs time a round's lookup, not the
    index growing by each answer (`HistoryTiming.add_ms` measures that)."""

    def add(self, document: Sequence[int]) -> None:
        pass


def zipf_history(n_tokens: int, n_vocab: int, seed: int = 2, doc: int = 2_000) -> HistoryIndex:
    """`n_tokens` tokens of Zipf(1.2)-distributed ids in documents of `doc` tokens: frequent ids
    repeat as in text, so a lookup finds many matches to compare."""
    rng = np.random.default_rng(seed)
    ids = (rng.zipf(1.2, size=n_tokens) - 1) % n_vocab
    index = FrozenHistory(capacity=2 * n_tokens + 1_000)
    starts = np.arange(0, n_tokens, doc)
    index._load_documents([ids[s:s + doc] for s in starts], np.arange(len(starts)), len(starts))
    return index


@dataclass(frozen=True)
class HistoryTiming:
    tokens: int
    lookups: int
    found: float  # share of lookups that matched
    median_ms: float
    p90_ms: float
    add_ms: float  # adding a 512-token document (after a generation)


def time_history(history: HistoryIndex, n_vocab: int, lookups: int = 400,
                 seed: int = 3) -> HistoryTiming:
    """A round's lookup (`match`, 8 tokens wanted) after contexts that are Zipf text like the
    history's; then the time to add one 512-token document to it."""
    rng = np.random.default_rng(seed)
    held = history.n_tokens
    times, found = [], 0
    for _ in range(lookups):
        context = ((rng.zipf(1.2, size=64) - 1) % n_vocab).tolist()
        t0 = time.perf_counter()
        found += len(history.match(context, 8, MIN_SHARE)) > 0
        times.append(time.perf_counter() - t0)
    doc = (rng.zipf(1.2, size=512) - 1) % n_vocab
    t0 = time.perf_counter()
    # The base class's add, which FrozenHistory skips: last, after every lookup was timed.
    HistoryIndex.add(history, doc.tolist())
    add_ms = (time.perf_counter() - t0) * 1e3
    ms = np.array(times) * 1e3
    return HistoryTiming(held, lookups, found / lookups, float(np.median(ms)),
                         float(np.percentile(ms, 90)), add_ms)


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
    # Only a history path names it: research/overhead_tree.py runs this harness on trees from
    # before the history.
    extra = {"history": history} if history is not None else {}
    for ev in pair.generate(prompt, config, drafter=drafter, raw=True, policy=policy, **extra):
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


def markdown(rows: Sequence[OverheadRow], n_vocab: int, machine: str,
             history: HistoryTiming | None = None) -> str:
    lines = [f"Engine time per committed token (ms), instant backends at {n_vocab:,} tokens; "
             f"{machine}", "",
             "| path | sampling | ms / token | ms / round | tokens / round | acceptance |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        acc = "—" if r.acceptance != r.acceptance else f"{r.acceptance:.2f}"
        lines.append(f"| {r.path} | {r.mode} | {r.ms_per_token:.3f} | {r.ms_per_round:.3f} | "
                     f"{r.tokens_per_round:.2f} | {acc} |")
    if history is not None:
        lines += ["", f"History lookup ({history.tokens:,} tokens, {history.lookups} lookups of "
                  f"Zipf text, {history.found:.0%} matched): median {history.median_ms:.3f} ms, "
                  f"p90 {history.p90_ms:.3f} ms a round; adding a 512-token answer "
                  f"{history.add_ms:.1f} ms."]
    return "\n".join(lines)


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


@dataclass(frozen=True)
class Spelling:
    """A vocabulary the instant backends spell text with: every token's bytes, and `encode`,
    which writes bytes with those tokens."""

    name: str
    table: TokenTable
    encode: Callable[[bytes], list[int]]

    @property
    def n_vocab(self) -> int:
        return len(self.table.pieces)


def qwen_spelling(path: str | Path) -> Spelling:
    """The vocabulary of a GGUF model file (the embedded Qwen2.5 target's: 151,936 tokens), read
    without its weights, as the llama.cpp backend hands it to llguidance."""
    vocab = Vocabulary(path)
    return Spelling(f"{Path(path).name}'s vocabulary", vocab.token_table(), vocab.tokenize)


def byte_spelling(n_vocab: int) -> Spelling:
    """Token i is byte i for i < 256, 256 is the end-of-generation control token, and the rest
    are distinct 2-3 byte pieces of printable ASCII (so a mask walks a vocabulary of
    `n_vocab` real tokens); text is written a byte a token."""
    printable = [bytes([c]) for c in range(32, 127)]
    pieces: list[bytes] = [bytes([b]) for b in range(256)] + [b"<|end|>"]
    for a in printable:
        for b in printable:
            pieces.append(a + b)
    for a in printable:
        for b in printable:
            for c in printable:
                if len(pieces) >= n_vocab:
                    break
                pieces.append(a + b + c)
    if len(pieces) < n_vocab:
        raise ValueError(f"the byte-level table spells at most {len(pieces):,} tokens")
    return Spelling(f"a byte-level table of {n_vocab:,} tokens",
                    TokenTable(tuple(pieces[:n_vocab]), frozenset({256}), 256), list)


class SpelledBackend(InstantBackend):
    """An instant backend whose tokens spell text as `spelling` does, so a grammar compiles
    for it and its forced stretches tokenize as its vocabulary would."""

    def __init__(self, bank: np.ndarray, name: str, spelling: Spelling) -> None:
        super().__init__(bank, name)
        self.spelling = spelling

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.spelling.encode(text.encode("utf-8"))

    def token_bytes(self, token: int) -> bytes:
        return self.spelling.table.pieces[token]

    def is_eog(self, token: int) -> bool:
        return token == self.spelling.table.eos

    def token_table(self) -> TokenTable:
        return self.spelling.table


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


def grammar_markdown(rows: Sequence[GrammarOverheadRow], spelling: Spelling, machine: str) -> str:
    lines = [f"The constraint's own cost: engine time per committed token (ms), free and under a "
             f"JSON schema, instant backends spelling with {spelling.name} "
             f"({spelling.n_vocab:,} tokens); {machine}", "",
             "| path | sampling | free ms / token | JSON schema ms / token | of which llguidance "
             "| forced | tokens / round | tokens an answer |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.path} | {r.mode} | {r.free_ms_per_token:.3f} | {r.ms_per_token:.3f} | "
                     f"{r.llguidance_ms_per_token:.3f} | {r.forced_share:.0%} | "
                     f"{r.tokens_per_round:.2f} | {r.answer_tokens:.0f} |")
    return "\n".join(lines)

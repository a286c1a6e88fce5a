"""`tandem bench --overhead`: the real generation loop over instant backends, every path and
sampling mode, timed without the backends' own time."""
from __future__ import annotations

import doctest
import math

import pytest

import bench.overhead.banks
from app.cli import main
from app.reports.overhead_markdown import grammar_markdown
from engine.control.policy import FixedGamma
from engine.events import RoundEvent
from engine.generation_config import GenerationConfig
from engine.pair import Pair
from bench.fakes.instant import CopyRefusingBackend, InstantBackend
from bench.fakes.spelled import byte_spelling
from bench.overhead.banks import llm_like_bank, pairs_text
from bench.overhead.engine_time import COPY_LETTERS, FRESH_LABEL, MODES, PATHS, run_overhead
from bench.overhead.grammar import GRAMMAR_MODES, GRAMMAR_PATHS, run_grammar_overhead


def test_every_path_and_mode_is_measured_without_the_backends_time():
    rows, history = run_overhead(n_vocab=6000, max_tokens=12, repeats=1, history_tokens=50_000,
                                 fresh_history_tokens=20_000)
    assert {(r.path, r.mode) for r in rows} == {(p[0], m) for p in PATHS for m in MODES}
    # The suffix paths drafted from the history, whose lookups were timed too.
    assert history is not None and history.tokens == 50_000 and history.found > 0.3
    assert 0 < history.median_ms <= history.p90_ms and history.add_ms > 0
    for r in rows:
        assert r.ms_per_token > 0 and r.ms_per_round >= r.ms_per_token * 0.999
        assert r.tokens_per_round >= 1
        assert math.isnan(r.acceptance) if r.path.startswith("plain") else (
            math.isnan(r.acceptance) or 0 <= r.acceptance <= 1)
    # On text that never repeats, with a draft that never agrees, nothing drafts: what the
    # default costs there is its bookkeeping alone.
    assert all(math.isnan(r.acceptance) for r in rows if FRESH_LABEL in r.path)
    # The draft model drafts in every mode (its bank is the target's with noise).
    assert all(r.acceptance > 0 for r in rows if r.path.startswith("draft model"))


def test_the_instant_backend_times_itself_and_answers_by_context():
    b = InstantBackend(llm_like_bank(300, seed=0, slots=4), "t")
    a = b.decode([1, 2, 3], 0, [1, 2])
    assert a.shape == (2, 300) and b.decode_s > 0
    b.truncate(1)
    assert (b.decode([2, 3], 1, [0, 1]) == a).all()


def test_the_cli_prints_the_table_with_the_machine(capsys):
    assert main(["bench", "--overhead", "--vocab", "5000", "--max-tokens", "6", "--repeats", "1",
                 "--overhead-paths", "none,lookup"]) == 0
    out = capsys.readouterr().out
    assert "logical CPUs" in out and "| plain | greedy |" in out and "prompt lookup" in out
    assert "draft model" not in out and "JSON schema" not in out


def _copy_rounds(target: InstantBackend, params) -> list:
    """Hybrid at a fixed gamma 4 over the losing-copies text: every copy on offer is drafted."""
    draft = InstantBackend(llm_like_bank(2000, seed=0, slots=8), "d", shift=1000)
    config = GenerationConfig(params=params, gamma=4, max_tokens=64)
    return [ev.round for ev in Pair(target, draft).generate(
        pairs_text(COPY_LETTERS), config, drafter="hybrid", raw=True, policy=FixedGamma(4))
            if isinstance(ev, RoundEvent)]


def test_the_losing_copies_text_offers_a_copy_nearly_every_round_and_every_copy_loses():
    """The "losing copies" paths: the prompt holds every pair of the text's letters, so
    prompt lookup has a copy after nearly every round; the target never continues a pair as
    before, so no copy's first token is taken, in any sampling mode. The same rows without
    the refusal take some copies: the control."""
    assert doctest.testmod(bench.overhead.banks).failed == 0
    assert sorted(set(pairs_text("abc")[i:i + 2] for i in range(9))) == [
        a + b for a in "abc" for b in "abc"]
    letters = [1 + ord(ch) for ch in COPY_LETTERS]
    bank = llm_like_bank(2000, seed=4, slots=8, tops=letters)
    for params in MODES.values():
        rounds = _copy_rounds(CopyRefusingBackend(bank, "t"), params)
        # The last round has room for its one token alone.
        copies = [r for r in rounds[:-1] if r.is_copy]
        assert len(copies) >= 0.95 * len(rounds)
        assert all(r.drafted > 0 and r.accepted == 0 for r in copies)
    taken = _copy_rounds(InstantBackend(bank, "t"), MODES["greedy"])
    assert sum(r.accepted for r in taken) > 0



def test_the_constraints_own_cost_is_measured_free_and_masked_on_a_small_vocabulary():
    spelling = byte_spelling(2000)
    rows = run_grammar_overhead(spelling, max_tokens=24, repeats=1)
    assert {(r.path, r.mode) for r in rows} == {(p[0], m) for p in GRAMMAR_PATHS
                                                for m in GRAMMAR_MODES}
    for r in rows:
        assert r.free_ms_per_token > 0 and r.ms_per_token > 0
        # llguidance's time is part of the engine's time under the schema.
        assert 0 < r.llguidance_ms_per_token < r.ms_per_token
        assert r.tokens_per_round >= 1 and 0 < r.answer_tokens <= 24
        # Plain decoding decodes every token with the target; speculation commits the
        # schema's keys and punctuation without a model.
        assert r.forced_share == 0 if r.path == "plain" else 0 < r.forced_share < 1
    table = grammar_markdown(rows, spelling, "machine")
    assert "a byte-level table of 2,000 tokens" in table and "| plain | greedy |" in table


def test_the_byte_level_spelling_writes_text_with_its_own_tokens():
    spelling = byte_spelling(9000)
    pieces = spelling.table.pieces
    assert len(pieces) == 9000 == len(set(pieces)) and spelling.table.control == {256}
    text = '{"name": "ünï"}'.encode()
    assert b"".join(pieces[t] for t in spelling.encode(text)) == text
    with pytest.raises(ValueError, match="at most"):
        byte_spelling(10_000_000)


def test_the_cli_runs_the_constraint_path_alone(capsys):
    assert main(["bench", "--overhead", "--vocab", "1000", "--max-tokens", "8", "--repeats", "1",
                 "--overhead-paths", "json"]) == 0
    out = capsys.readouterr().out
    assert "JSON schema ms / token" in out and "byte-level table of 1,000 tokens" in out
    assert "prompt lookup" not in out

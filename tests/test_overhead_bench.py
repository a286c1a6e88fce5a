"""`tandem bench --overhead`: the real generation loop over instant backends, every path and
sampling mode, timed without the backends' own time."""
from __future__ import annotations

import math

import pytest

from app.cli import main
from engine.tools.benchmark.overhead import (FRESH_LABEL, GRAMMAR_MODES, GRAMMAR_PATHS, MODES,
                                             PATHS, InstantBackend, byte_spelling,
                                             grammar_markdown, llm_like_bank, run_grammar_overhead,
                                             run_overhead)


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

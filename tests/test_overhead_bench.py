"""`tandem bench --overhead`: the real generation loop over instant backends, every path and
sampling mode, timed without the backends' own time."""
from __future__ import annotations

import math

from app.cli import main
from engine.tools.benchmark.overhead import (FRESH_LABEL, MODES, PATHS, InstantBackend,
                                             llm_like_bank, run_overhead)


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
    assert "draft model" not in out

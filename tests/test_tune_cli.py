"""`tandem tune`'s command-line side without models: prompts, table, record; `tandem pairs`."""
from __future__ import annotations

import argparse

import pytest

from app.cli import main
from app.runtime.prompt_sets import interleave
from app.tune_cli import build_record, table_lines, tune_prompts
from engine.backend import ModelConfig
from bench.benchmark.suite import SuitePrompt
from engine.errors import SettingsError
from engine.sampling import SamplingParams
from models.candidate import Candidate
from bench.tuning.measure import CandidateResult, PairRun
from app.runtime.tuned import key_for
from models.tuned import find, save


def _args(**kw) -> argparse.Namespace:
    base = dict(prompts=None, category=None, max_tokens=64)
    base.update(kw)
    return argparse.Namespace(**base)


def test_prompts_come_round_robin_over_categories():
    ps = [SuitePrompt(f"{c}{i}", c, "x") for c in "ab" for i in range(3)]
    assert [p.id for p in interleave(ps)] == ["a0", "b0", "a1", "b1", "a2", "b2"]
    suite = tune_prompts(_args())
    assert len({p.category for p in suite[:6]}) == 6
    assert {p.category for p in tune_prompts(_args(category=["chat,math"]))} == {"chat", "math"}


def test_a_plain_text_prompts_file(tmp_path):
    f = tmp_path / "mine.txt"
    f.write_text("first prompt\n\n second prompt \n")
    got = tune_prompts(_args(prompts=str(f)))
    assert [(p.id, p.category, p.prompt) for p in got] == [
        ("line-1", "prompts", "first prompt"), ("line-2", "prompts", "second prompt")]
    with pytest.raises(SettingsError, match="suite"):
        tune_prompts(_args(prompts=str(f), category=["chat"]))
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(SettingsError, match="no prompts"):
        tune_prompts(_args(prompts=str(tmp_path / "empty.txt")))
    with pytest.raises(SettingsError, match="cannot read"):
        tune_prompts(_args(prompts=str(tmp_path / "missing.txt")))


def _results() -> list[CandidateResult]:
    fast = CandidateResult(Candidate("draft", draft_quant="q4_0"))
    fast.runs = [PairRun(f"p{i}", c, 10.0, 10.0 * s, 40, 30, 400.0, 100.0)
                 for i, (c, s) in enumerate([("code", 1.5), ("chat", 0.9), ("code", 1.4)])]
    idle = CandidateResult(Candidate("lookup"))
    idle.runs = [PairRun("p0", "code", 10.0, 9.0, 0, 0, 0.0, 100.0)]
    idle.stopped = "its share of the budget, after 1 prompts"
    broken = CandidateResult(Candidate("early-exit", early_exit_layers=21), error="cannot load")
    return [fast, idle, broken]


def test_table_and_choices():
    lines = table_lines(_results(), ["code", "chat"])
    assert lines[0].split()[:3] == ["candidate", "prompts", "accept"]
    row = next(ln for ln in lines if ln.startswith("draft-q4_0"))
    assert "0.75" in row and "1.40x" in row
    # Lookup never drafted: no acceptance or cost to show.
    assert next(ln for ln in lines if ln.startswith("lookup")).split()[2] == "-"
    assert "cannot load" in next(ln for ln in lines if ln.startswith("early-exit-21"))
    assert "best for overall: draft-q4_0 1.40x" in lines
    assert "best for code: draft-q4_0 1.45x" in lines
    assert any(ln.startswith("best for chat: plain") for ln in lines)


def test_the_record_holds_choices_measurements_and_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "store"))
    monkeypatch.delenv("TANDEM_PAIRS", raising=False)
    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    t.write_bytes(b"t" * 10)
    d.write_bytes(b"d" * 10)
    tcfg, dcfg = ModelConfig(str(t), n_threads=2), ModelConfig(str(d))
    key = key_for(t, d)
    rec = build_record(_results(), ["code", "chat"], key, tcfg, dcfg, _args(),
                       SamplingParams(temperature=0.7, top_p=0.9))
    assert rec.chosen.candidate == Candidate("draft", draft_quant="q4_0")
    assert rec.by_category["chat"].candidate.drafter == "plain"
    assert rec.measured["draft-q4_0"]["acceptance_min"] == pytest.approx(0.75)
    assert rec.machine["device"] == "CPU" and rec.machine["threads"] == 2
    assert rec.sampling["temperature"] == 0.7 and rec.tandem_version
    save(rec)
    assert find(key).chosen == rec.chosen


def test_pairs_lists_records(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "store"))
    monkeypatch.delenv("TANDEM_PAIRS", raising=False)
    assert main(["pairs"]) == 0
    assert "no pairing records" in capsys.readouterr().out
    test_the_record_holds_choices_measurements_and_machine(tmp_path, monkeypatch)
    assert main(["pairs"]) == 0
    out = capsys.readouterr().out
    assert "t.gguf / d.gguf" in out and "chosen draft q4_0 adaptive g=8: 1.40x" in out
    assert "chat: plain decoding" in out


def test_tune_refuses_bad_options(capsys):
    assert main(["tune", "--budget-minutes", "0"]) == 2
    assert "budget-minutes" in capsys.readouterr().err

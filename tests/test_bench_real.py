"""`tandem bench --quick` end to end on a small real model (SmolLM2-135M as target and draft)."""
from __future__ import annotations

import csv
import json

import pytest

from app.cli import main
from bench.benchmark.files import runs_dir
from tests.realmodels import smollm2_135m

pytestmark = pytest.mark.real


def test_bench_quick_writes_every_report(tmp_path, capsys, monkeypatch):
    model = str(smollm2_135m())
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    out = tmp_path / "bench"
    rc = main(["bench", "--quick", "--categories", "code-editing", "--max-tokens", "10",
               "--gammas", "2,3", "--target", model, "--draft", model, "--threads", "2",
               "--ctx", "1024", "--no-budget-check", "--draft-quant", "off", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "draft g=2, greedy: median speedup" in printed
    assert "latency-optimal gamma for draft-model fixed, greedy:" in printed
    # The raw runs go to the user's cache, the report folder keeps tables and plots.
    raw = runs_dir(out)
    assert raw.is_relative_to(tmp_path / "home") and not (out / "runs.json").exists()
    data = json.loads((raw / "runs.json").read_text())
    runs = data["runs"]
    assert [r["role"] for r in runs].count("baseline") == 1 and len(runs) == 3
    for r in runs:
        assert r["output_tokens"] == 10 and r["prompt_tokens"] > 20 and r["prefill_ms"] > 0
        if r["role"] == "speculative":
            # Target and draft are the same model: nearly every drafted token is accepted.
            assert r["acceptance_rate"] > 0.7 and r["speedup"] > 0
    assert len(list(csv.DictReader(open(raw / "runs.csv")))) == 3
    md = (out / "report.md").read_text()
    assert "## Gamma sweep" in md and "tandem bench --categories code-editing" in md
    assert "--gammas 2,3 --temperatures 0 --top-p 1.0 --max-tokens 10 --prompts-per-category 1" in md
    assert "--draft-quant off" in md and "loaded as" not in md
    for png in ("speedup_by_category.png", "gamma_sweep.png", "acceptance_by_position.png"):
        assert (out / png).stat().st_size > 1000


def test_the_report_names_the_draft_file_actually_loaded():
    from types import SimpleNamespace

    from app.bench_cli import _draft_words
    from engine.backend import ModelConfig
    cfg = ModelConfig("/models/small.gguf")
    derived = SimpleNamespace(draft_path="/store/derived/small.q4_0.0123456789abcdef.gguf")
    assert _draft_words(derived, cfg) == ("/models/small.gguf (loaded as "
                                          "/store/derived/small.q4_0.0123456789abcdef.gguf)")
    assert _draft_words(SimpleNamespace(draft_path="/models/small.gguf"), cfg) == "/models/small.gguf"
    assert _draft_words(SimpleNamespace(draft_path=None), None) == "none"


def test_bench_rejects_an_unknown_drafter_before_running(tmp_path, capsys):
    model = str(smollm2_135m())
    rc = main(["bench", "--quick", "--drafter", "oracle", "--target", model, "--draft", model,
               "--threads", "2", "--ctx", "512", "--no-budget-check", "--out", str(tmp_path)])
    assert rc == 2
    assert "error: unknown drafter 'oracle'" in capsys.readouterr().err

"""`tandem exactness --quick` end to end on a small real model (SmolLM2-135M as target and draft).

With one model as both target and draft q equals p up to batch numerics, so the biased control
is indistinguishable from the exact rule here; this test checks the command's plumbing and
report, while tests/test_exactness_fake.py checks that the control is caught."""
from __future__ import annotations

import json

import pytest

from app.cli import main
from tests.realmodels import smollm2_135m

pytestmark = pytest.mark.real


def test_exactness_quick_prints_every_setting_and_writes_the_report(tmp_path, capsys):
    model = str(smollm2_135m())
    out = tmp_path / "exact"
    rc = main(["exactness", "--quick", "--samples", "20", "--cap", "4", "--greedy-prompts", "1",
               "--greedy-tokens", "8", "--target", model, "--draft", model, "--threads", "2",
               "--ctx", "512", "--no-budget-check", "--draft-quant", "off", "--out", str(out)])
    printed = capsys.readouterr().out.splitlines()
    data = json.loads((out / "exactness.json").read_text())
    assert rc == (0 if data["passed"] else 1)
    verdicts = [line.split()[0] for line in printed if line.split()[:1] in (["PASS"], ["FAIL"])]
    assert len(verdicts) == 5  # four settings and the control
    assert any(line.startswith("greedy agreement: ") and "/1 identical" in line for line in printed)
    assert [r["name"] for r in data["results"]] == ["temperature 1.0", "temperature 0.7, top-p 0.9",
                                                    "top-k 20", "min-p 0.05"]
    for r in data["results"] + [data["control"]]:
        assert [c["n_a"] for c in r["comparisons"]] == [20, 20, 20]
        assert all(0.0 <= c["p_value"] <= 1.0 and 0.0 <= c["tv"] <= 1.0 for c in r["comparisons"])
    # Same model on both sides: speculation accepts nearly everything.
    assert data["results"][0]["acceptance_rate"] > 0.7
    md = (out / "exactness.md").read_text()
    assert "## Negative control" in md and "## Greedy agreement" in md

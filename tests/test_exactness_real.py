"""`tandem exactness --quick` end to end on a small real model (SmolLM2-135M as target and draft).

With one model as both target and draft q equals p up to batch numerics, so the biased control
is indistinguishable from the exact rule here; these tests check the command's plumbing and
report, while tests/test_exactness_fake.py checks that the control is caught."""
from __future__ import annotations

import json

import pytest

from app.cli import main
from tests.realmodels import smollm2_135m

pytestmark = pytest.mark.real


def run(tmp_path, capsys, *extra):
    model = str(smollm2_135m())
    out = tmp_path / "exact"
    rc = main(["exactness", "--quick", "--samples", "20", "--compare", "2", "--greedy-prompts", "1",
               "--greedy-tokens", "8", "--target", model, "--draft", model, "--threads", "2",
               "--ctx", "512", "--no-budget-check", "--draft-quant", "off", "--out", str(out),
               *extra])
    printed = capsys.readouterr().out.splitlines()
    return rc, printed, json.loads((out / "exactness.json").read_text()), out


@pytest.mark.long
def test_exactness_quick_prints_every_setting_and_writes_the_report(tmp_path, capsys):
    rc, printed, data, out = run(tmp_path, capsys, "--settings", "all", "--policy", "fixed",
                                 "--gamma", "2")
    assert rc == (0 if data["passed"] else 1)
    verdicts = [line.split()[0] for line in printed if line.split()[:1] in (["PASS"], ["FAIL"])]
    assert len(verdicts) == 5  # four settings and the control
    assert any(line.startswith("greedy agreement: ") and "/1 identical" in line for line in printed)
    assert [r["name"] for r in data["results"]] == ["temperature 1.0", "temperature 0.7, top-p 0.9",
                                                    "top-k 20", "min-p 0.05"]
    # The pair's default drafter; a fixed policy drafts from the first token, so positions
    # 0 and 1 are compared.
    assert data["context"]["drafter"] == "hybrid" and data["plan"]["first"] == 0
    for r in data["results"] + [data["control"]]:
        assert [c["statistic"] for c in r["comparisons"]] == ["tokens -1,0", "tokens 0,1"]
        assert [c["n_a"] for c in r["comparisons"]] == [20, 20]
        assert all(0.0 <= c["p_value"] <= 1.0 and 0.0 <= c["tv"] <= 1.0 for c in r["comparisons"])
        assert len(r["detectable"]) == 2 and len(r["drafted_share"]) == 2
    # Same model on both sides: speculation accepts nearly everything.
    assert data["results"][0]["acceptance_rate"] > 0.7
    md = (out / "exactness.md").read_text()
    assert "## Negative control" in md and "## Greedy agreement" in md


@pytest.mark.long
def test_the_default_checks_the_default_path_from_its_opening(tmp_path, capsys):
    """Hybrid and the adaptive controller, comparing from the policy's forced plain opening (none
    by default: its first rounds are judged at the opening acceptance instead).
    Whether anything is drafted there depends on the machine (the draft model here costs as
    much as the target; prompt lookup is free); the verdict says which, and a setting that
    drafted nothing is NOT EXERCISED rather than PASS."""
    rc, printed, data, _ = run(tmp_path, capsys)
    assert data["context"]["drafter"] == "hybrid" and data["context"]["policy"] == "adaptive"
    assert data["plan"]["first"] == 0 and data["plan"]["tokens"] == 2
    assert [r["name"] for r in data["results"]] == ["temperature 0.7, top-p 0.9"]
    result = data["results"][0]
    assert printed[0].startswith("NOT EXERCISED") == (result["drafted"] == 0)
    assert rc == (0 if data["passed"] else 1)
    if result["drafted"] == 0:
        assert not data["passed"]

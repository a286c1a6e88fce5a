"""Two `tandem generate` runs in a row, each its own process: the second starts from the evidence
the first kept (loading/evidence.py), prints no warning and sets nothing aside. Each store owns its
file names (the pairing records `pairs/<id>.json`, the evidence `evidence/<id>.json`), so the
load's look for stale pairing records (models/tuned.py `stale_for`) reads no evidence file.

The runs are the command line's whole load path (the record look-up, the plan over tiny GGUFs,
the load, the evidence, the answer), with fake models standing in for llama.cpp's. The negative
control runs the same two processes with the old layout put back (evidence kept in `pairs/` as
`<id>.evidence.json`, records read by a glob of `pairs/*.json`), and the check finds all three
failures it was written for.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import tinygguf

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 300

# `tandem generate` with fakes for llama.cpp's models (as tests/test_robustness_sweep.py runs
# it in-process); with "--old-layout" first, the stores as they were before each owned its names.
DRIVER = """
import sys
from unittest import mock

from engine.llama import backend as llama
from bench.fakes.backend import FakeBackend

def load(config):
    return FakeBackend(n_ctx=config.n_ctx, n_batch=min(config.n_batch, config.n_ctx), eog=59,
                       noise=0.0 if "target" in config.path else 1.0)

argv = sys.argv[1:]
patches = [mock.patch.object(llama, "load", load)]
if argv[:1] == ["--old-layout"]:
    argv = argv[1:]
    from loading import evidence
    from models import tuned
    patches += [
        mock.patch.object(evidence, "evidence_path",
                          lambda key: tuned.pairs_dir() / f"{key.id}.evidence.json"),
        mock.patch.object(tuned, "record_paths",
                          lambda: sorted(tuned.pairs_dir().glob("*.json"))),
    ]
for p in patches:
    p.start()
from app.cli import main
sys.exit(main(argv))
"""


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("pair")
    vocab = tinygguf.vocab(64)
    return (tinygguf.write(d / "target.gguf", tokens=vocab, n_ctx_train=4096),
            tinygguf.write(d / "draft.gguf", tokens=vocab, n_ctx_train=4096))


def _generate(gguf_pair, tmp_path: Path, old_layout: bool) -> subprocess.CompletedProcess:
    target, draft = gguf_pair
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TANDEM_MODELS": str(tmp_path / "store"),
           "TANDEM_PAIRS": str(tmp_path / "pairs"), "TANDEM_EVIDENCE": str(tmp_path / "evidence"),
           "TANDEM_HISTORY": str(tmp_path / "history")}
    argv = [sys.executable, "-c", DRIVER, *(["--old-layout"] if old_layout else []),
            "generate", "--target", str(target), "--draft", str(draft), "--draft-quant", "off",
            "--drafter", "draft", "--prompt", "tok5 tok6 tok7", "--max-tokens", "24",
            "--temperature", "0", "--no-history", "--json"]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _answers(tmp_path: Path) -> dict[str, int]:
    """Answers per drafter in every evidence file under the stores' folders."""
    found: dict[str, int] = {}
    for folder in ("evidence", "pairs"):
        for path in sorted((tmp_path / folder).glob("*.json")):
            stored = json.loads(path.read_text())
            for drafter, kept in (stored.get("drafters") or {}).items():
                found[drafter] = found.get(drafter, 0) + int(kept["answers"])
    return found


def two_runs_problems(gguf_pair, tmp_path: Path, old_layout: bool = False) -> list[str]:
    """Run `tandem generate` twice, each in a new process; what went wrong, in words."""
    first = _generate(gguf_pair, tmp_path, old_layout)
    after_first = _answers(tmp_path)
    assert after_first and set(after_first.values()) == {1}, (after_first, first.stderr)
    second = _generate(gguf_pair, tmp_path, old_layout)
    problems = []
    warnings = [line for proc in (first, second) for line in proc.stderr.splitlines()
                if "warning" in line.lower()]
    if warnings:
        problems.append(f"warnings: {warnings}")
    aside = sorted(p.name for p in tmp_path.rglob("*.corrupt-*"))
    if aside:
        problems.append(f"set aside: {aside}")
    after_second = _answers(tmp_path)
    if after_second != {d: n + 1 for d, n in after_first.items()}:
        problems.append(f"the second run did not start from the first's evidence: "
                        f"{after_first} then {after_second}")
    return problems


def test_the_second_run_starts_from_the_first_runs_evidence(gguf_pair, tmp_path):
    assert two_runs_problems(gguf_pair, tmp_path) == []
    # Each store's file in its own folder, under its own name.
    assert [p.name for p in (tmp_path / "evidence").iterdir()] != []
    assert not list((tmp_path / "pairs").glob("*evidence*"))


def test_the_check_catches_a_record_reader_that_reads_the_evidence(gguf_pair, tmp_path):
    problems = two_runs_problems(gguf_pair, tmp_path, old_layout=True)
    assert [p.split(":")[0] for p in problems] == [
        "warnings", "set aside", "the second run did not start from the first's evidence"]
    assert "the pairing record" in problems[0] and ".evidence.json.corrupt-" in problems[1]

"""`tandem adapt`'s gate and its refusals on fakes (issue 63): the verdict needs a bootstrap
interval above zero at greedy and at T 0.7 over enough held-out prompts, no other category
losing more than 0.02 and measured tokens/s not below the base; the files measured are the ones
the loader will serve (requantized under `draft_quant` auto); a pair whose base draft already
accepts above the threshold is declined before training unless forced; `--context` that is not
a multiple of 256 is refused in one line; a request too long for the teacher is skipped with a
note."""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from app.runtime.open_pair import served_file
from bench.adapt import build, data, proof, run, session
from bench.adapt.settings import Settings
from bench.fakes.backend import FakeBackend
from engine.backend import ModelConfig
from models.candidate import Candidate
from models.gguf_info import read_info
from models.machine import Machine
from models.tuned import PairKey
from tests import tinygguf

CPU = {(name, t): 10.0 for name in ("base", "adapted") for t in proof.TEMPERATURES}


def _rounds(accepted: float) -> proof.Rounds:
    return proof.Rounds(gamma=2, reached=np.array([1.0, accepted]),
                        accepted=np.array([accepted, accepted * accepted]), rounds=1)


def _measured(yours: dict[str, list[float]], others: dict[str, list[float]] | None = None,
              n: int = 10) -> proof.Measured:
    """Per prompt acceptance of base and adapted on yours (and on other categories)."""
    out: proof.Measured = {}
    for cat, per in {run.YOURS: yours, **(others or {})}.items():
        for t in proof.TEMPERATURES:
            for name in ("base", "adapted"):
                out[name, cat, t] = [_rounds(a) for a in per[name][:n]]
    return out


def _decide(measured: proof.Measured, cpu=CPU) -> tuple[bool, str]:
    cats = list(dict.fromkeys(c for _, c, _ in measured))
    return run.decide(run.rows(measured, cats), cpu)


def test_the_gate_wins_only_where_the_interval_over_prompts_excludes_zero():
    base = [0.5] * 10
    # Every prompt gains: the interval is above zero, at both temperatures.
    wins, why = _decide(_measured({"base": base, "adapted": [0.6] * 10}))
    assert wins and "T 0.7" in why
    # Tokens per call 1 + a + a^2: 1.75 -> 1.96, +12.0%, every resample alike.
    assert "+12.0% tokens per target call" in why and "(95% interval +12.0% to +12.0%)" in why
    # The same mean gain from two prompts of ten, the rest losing a little: noise, kept.
    noisy = [0.95, 0.95] + [0.48] * 8
    assert np.mean(noisy) > np.mean(base)
    wins, why = _decide(_measured({"base": base, "adapted": noisy}))
    assert not wins and "does not exclude zero" in why
    # Too few held-out prompts to tell, however clear the gain.
    wins, why = _decide(_measured({"base": base, "adapted": [0.7] * 10}, n=run.MIN_YOURS - 1))
    assert not wins and f"needs at least {run.MIN_YOURS}" in why


def test_the_gate_keeps_the_base_where_another_category_or_the_speed_loses():
    gain = {"base": [0.5] * 10, "adapted": [0.6] * 10}
    chat = {"chat": {"base": [0.6] * 10, "adapted": [0.57] * 10}}
    wins, why = _decide(_measured(gain, chat))
    assert not wins and "chat" in why and "more than 0.02" in why
    fine = {"chat": {"base": [0.6] * 10, "adapted": [0.59] * 10}}
    assert _decide(_measured(gain, fine))[0]
    slower = {**CPU, ("adapted", 0.7): 9.5}
    wins, why = _decide(_measured(gain, fine), slower)
    assert not wins and "tokens/s" in why and "T 0.7" in why


@pytest.fixture
def pair_files(tmp_path, monkeypatch):
    """A target and a heavy (F32) draft on disk, a CPU-only machine, the store in tmp_path."""
    for env, sub in (("TANDEM_HOME", "home"), ("TANDEM_MODELS", "store"),
                     ("TANDEM_PAIRS", "pairs")):
        monkeypatch.setenv(env, str(tmp_path / sub))
    monkeypatch.setattr("loading.devices.detect", lambda: Machine(64 << 30, 60 << 30))
    vocab = tinygguf.vocab(64)
    return (tinygguf.write(tmp_path / "t.gguf", tokens=vocab),
            tinygguf.write(tmp_path / "d.gguf", tokens=vocab))


def _held(target: FakeBackend, n_yours: int) -> list[data.Example]:
    prompts = [(run.YOURS, [1 + i % 50, 2 + i % 40, 3]) for i in range(n_yours)]
    return data.teach(target, prompts, 8, seed=0)


def _run_adapt(tmp_path, pair_files, monkeypatch, backends, settings, trained_file=None):
    """build.adapt with fake backends by file name; the files it loaded and whether it
    trained."""
    target, draft = pair_files
    loaded: list[str] = []
    trained: list[bool] = []

    def backend(config):
        loaded.append(Path(config.path).name)
        return contextlib.nullcontext(backends(Path(config.path).name))

    def fake_train(dinfo, key, examples, settings, threads, step):
        trained.append(True)
        out = trained_file or tmp_path / "store" / "d.adapted-x.gguf"
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(draft, out)
        return out, "sha", ["trained"], []

    monkeypatch.setattr(build, "quiet_backend", backend)
    monkeypatch.setattr(build, "_train", fake_train)
    monkeypatch.setattr(run, "cpu_speed", lambda tb, drafts, prompts, gen: CPU)
    tcfg, dcfg = ModelConfig(str(target), n_ctx=256), ModelConfig(str(draft), n_ctx=256)
    held = _held(FakeBackend(seed=1), run.MIN_YOURS)
    result = build.adapt(tcfg, dcfg, read_info(draft), PairKey("t" * 64, "", "d" * 64),
                         held[:4], held, settings, 1, lambda s: None,
                         Candidate("draft", draft_quant="auto"),
                         served_file(tcfg, lambda src, tmp, kind: shutil.copy(src, tmp)))
    return result, loaded, trained


def test_the_gate_measures_the_files_as_the_loader_will_serve_them(tmp_path, pair_files,
                                                                   monkeypatch):
    """On a CPU, draft_quant auto serves a heavy draft as its Q4_0 copy: the proof measures
    that copy of the base and of the adapted draft, never the files the trainer wrote."""
    def backends(name):
        return FakeBackend(seed=1) if name == "t.gguf" else FakeBackend(seed=1, noise=2.0)

    result, loaded, trained = _run_adapt(tmp_path, pair_files, monkeypatch, backends,
                                         Settings())
    assert trained
    drafts = [n for n in loaded if n != "t.gguf"]
    assert drafts and all(".q4_0." in n for n in drafts), drafts
    assert any(n.startswith("d.adapted-x") for n in drafts)
    assert any("measured as served (draft_quant auto)" in line for line in result.lines)


def test_a_pair_with_little_left_to_gain_is_declined_unless_forced(tmp_path, pair_files,
                                                                   monkeypatch):
    """Measured first, on the base draft as served: declined before the held-out suite is
    answered or anything trains; without a threshold (forced) the run goes on."""
    target, draft = pair_files
    names: list[str] = []

    def backend(config):
        names.append(Path(config.path).name)
        return contextlib.nullcontext(FakeBackend(seed=1))  # the draft is the target

    monkeypatch.setattr(build, "quiet_backend", backend)
    mine = _held(FakeBackend(seed=1), run.MIN_YOURS)
    went_on: list[str] = []
    monkeypatch.setattr(session, "teacher", lambda *a: (mine[:4], mine[4:]))
    monkeypatch.setattr(session, "suite_answers", lambda *a: went_on.append("suite") or [])
    monkeypatch.setattr(session, "adapt", lambda *a: went_on.append("adapt") or "trained")
    tcfg, dcfg = ModelConfig(str(target), n_ctx=256), ModelConfig(str(draft), n_ctx=256)
    progress = type("P", (), {"line": lambda self, text: None, "step": None})()
    serve = served_file(tcfg, lambda src, tmp, kind: shutil.copy(src, tmp))

    def run_it(settings):
        return session.adapt_pair(tcfg, dcfg, PairKey("t" * 64, "", "d" * 64), lambda f: [],
                                  settings, 1, progress, Candidate("draft", draft_quant="auto"),
                                  serve)

    result = run_it(Settings(decline_above=0.85))
    assert result.path is None and not result.wins and not went_on
    (line,) = result.lines
    assert line.startswith("declined:") and "1.000 per position" in line and "0.85" in line
    assert names and all(".q4_0." in n for n in names)  # measured as served
    assert run_it(Settings()) == "trained" and went_on == ["suite", "adapt"]
    # A draft that leaves room is not declined.
    monkeypatch.setattr(build, "quiet_backend",
                        lambda c: contextlib.nullcontext(FakeBackend(seed=1, noise=2.0)))
    assert build.declined(tcfg, dcfg, PairKey("t" * 64, "", "d" * 64),
                          Candidate("draft"), serve, mine, 0.85, 1) is None


def test_run_adapt_declines_by_default_and_trains_when_forced(monkeypatch):
    from app.runtime import adapt as runtime
    from app.runtime.defaults import ADAPT_DECLINE_ABOVE
    seen = []
    monkeypatch.setattr(runtime.session, "adapt_pair", lambda *a: seen.append(a[4]) or None)
    monkeypatch.setattr("app.runtime.tuned.key_for", lambda *a: PairKey("t", "", "d"))
    for force in (False, True):
        runtime.run_adapt(ModelConfig("t.gguf"), ModelConfig("d.gguf"), lambda f: [],
                          Settings(), 1, None, force=force)
    assert [s.decline_above for s in seen] == [ADAPT_DECLINE_ABOVE, None]


@pytest.mark.parametrize("context", ["128", "64", "300"])
def test_a_context_that_is_not_a_multiple_of_256_is_refused_in_one_line(context, capsys):
    from app.cli import main
    assert main(["adapt", "--target", "t.gguf", "--draft", "d.gguf", "--context",
                 context]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--context {context}" in err and "multiple of 256" in err


def test_a_request_too_long_for_the_teacher_is_skipped_with_a_note():
    notes: list[str] = []
    prompts = [("c", [1] * 10), ("c", [1] * 5000), ("c", [2] * 20)]
    kept = session.fitting(prompts, session.TEACHER_CTX - 64, notes.append)
    assert kept == [prompts[0], prompts[2]]
    (note,) = notes
    assert "skipped 1 of 3 requests" in note and "5000" in note

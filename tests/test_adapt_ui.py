"""The Models tab's "Adapt the draft" action, on fakes: it runs the same adaptation as
`tandem adapt` (app/runtime/adapt.py `run_adapt`) for the chosen files, keyed by the target's
LoRA adapter, shows the progress with the time left while it runs and then the proof's table,
and shows a refusal in one line."""
from __future__ import annotations

import threading

from app.runtime import adapt as runtime
from app.ui import adapt_action, wizard
from bench.adapt.build import Result
from bench.adapt.train import Step
from engine.errors import SettingsError
from tests import tinygguf


def _files(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "store"))
    monkeypatch.setenv("TANDEM_PAIRS", str(tmp_path / "pairs"))
    vocab = tinygguf.vocab(64)
    target = tinygguf.write(tmp_path / "t.gguf", tokens=vocab)
    draft = tinygguf.write(tmp_path / "d.gguf", tokens=vocab)
    lora = tmp_path / "lora.gguf"
    lora.write_bytes(b"an adapter")
    return target, draft, lora


def test_the_models_tab_adapts_the_draft_with_progress_then_the_proof(tmp_path, monkeypatch):
    target, draft, lora = _files(tmp_path, monkeypatch)
    seen: dict = {}
    stepped, shown = threading.Event(), threading.Event()

    def fake(tcfg, dcfg, key, prompts, settings, threads, progress, default, serve):
        seen.update(tcfg=tcfg, dcfg=dcfg, key=key, settings=settings,
                    prompts=prompts(lambda text: [len(text)]))
        progress.line("memory plan: 1.0 GiB")
        progress.stage("teacher answers")(1, 4)
        progress.step(Step(3, 10, 1.25, 6.0))
        stepped.set()
        shown.wait(5)
        return Result(tmp_path / "d.adapted.gguf", True, ["held out  T  mean", "adapted draft is "
                                                          "the default: +0.060"])

    monkeypatch.setattr(runtime.session, "adapt_pair", fake)
    monkeypatch.setattr(adapt_action, "POLL_S", 0.01)
    prompts = tmp_path / "mine.txt"
    prompts.write_text("write a sort\nfix this bug\n")
    notes = []
    for note in wizard.adapt("", str(target), "", str(draft), str(lora), 0.5, str(prompts),
                             "head+last2", 3):
        notes.append(note)
        if stepped.is_set():
            shown.set()
    assert any("training: step 3/10, loss 1.250, 6 s, about 14 s left" in n for n in notes)
    assert "memory plan: 1.0 GiB" in notes[-1] and "adapted draft is the default" in notes[-1]
    assert "<b>Adapted</b>" in notes[-1]
    # The CLI's run: the files chosen, the target's adapter in the config and in the key.
    assert seen["tcfg"].lora == ((str(lora), 0.5),) and seen["dcfg"].path == str(draft)
    assert seen["key"].adapter_sha256.endswith("@0.5")
    assert (seen["settings"].train, seen["settings"].epochs) == ("head+last2", 3)
    assert seen["prompts"] == [("prompts", [len("write a sort")]), ("prompts", [len("fix this bug")])]


def test_the_adapt_action_refuses_in_one_line(tmp_path, monkeypatch):
    target, draft, _ = _files(tmp_path, monkeypatch)

    def refuse(*args):
        raise SettingsError("adapting d.gguf needs 9 GiB and 2 GiB is free; --train last2 would fit")

    monkeypatch.setattr(runtime.session, "adapt_pair", refuse)
    notes = list(wizard.adapt("", str(target), "", str(draft)))
    assert notes[-1].startswith("<p><b>Refused:</b> adapting d.gguf needs 9 GiB")
    missing = list(wizard.adapt("", str(target), "", str(tmp_path / "absent.gguf")))
    assert missing == ["<p><b>Refused:</b> choose a target and a draft on disk first (steps 1, "
                       "2 and 4).</p>"]


def test_a_declined_run_says_declined_with_its_measured_reason(tmp_path, monkeypatch):
    target, draft, _ = _files(tmp_path, monkeypatch)
    line = "declined: the base draft (d.gguf) already accepts 0.912 per position at greedy"
    monkeypatch.setattr(runtime.session, "adapt_pair", lambda *a: Result(None, False, [line]))
    monkeypatch.setattr(adapt_action, "POLL_S", 0.01)
    notes = list(wizard.adapt("", str(target), "", str(draft)))
    assert "<b>Declined</b>" in notes[-1] and "0.912 per position" in notes[-1]
    assert "<b>Adapted</b>" not in notes[-1]

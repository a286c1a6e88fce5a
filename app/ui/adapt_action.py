"""The Models tab's "Adapt the draft" action: `tandem adapt` for the chosen pair (the target's
LoRA adapter included), run by the same code (app/runtime/adapt.py `run_adapt`) in a thread of
its own while the page shows its progress with the time left, then the proof's table and the
reason line that says whether the adapted draft became the default."""
from __future__ import annotations

import html
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import gradio as gr

from app.runtime import adapt as runtime
from bench.adapt.settings import Settings
from bench.adapt.train import CHOICES, Step
from engine.backend import ModelConfig
from engine.errors import TandemError

POLL_S = 0.5


@dataclass
class Shown:
    """What the page shows of a run so far: its lines, the stage in progress, and its end."""
    lines: list[str] = field(default_factory=list)
    current: str = ""
    result: Any = None
    error: str = ""
    done: bool = False

    def line(self, text: str) -> None:
        self.lines.append(text)

    def stage(self, what: str) -> Callable[[int, int], None]:
        start = time.monotonic()

        def show(i: int, n: int) -> None:
            spent = time.monotonic() - start
            self.current = (f"{what}: {i}/{n}, {spent:.0f} s, about "
                            f"{spent / i * (n - i):.0f} s left")
        return show

    def step(self, s: Step) -> None:
        self.current = (f"training: step {s.done}/{s.total}, loss {s.loss:.3f}, "
                        f"{s.elapsed_s:.0f} s, about {s.eta_s:.0f} s left")

    def html(self) -> str:
        body = "\n".join([*self.lines, *([self.current] if self.current and not self.done
                                         else [])])
        if self.error:
            return f"<p><b>Refused:</b> {html.escape(self.error)}</p>"
        declined = self.result is not None and self.result.path is None
        head = ("<p><b>Declined</b></p>" if declined else "<p><b>Adapted</b></p>"
                if self.done else "<p>adapting the draft...</p>")
        return f"{head}<pre id='wizard-adapt-table'>{html.escape(body)}</pre>"


def adapt_draft(tpath: Path | None, dpath: Path | None, lora: tuple, prompts_file: str,
                train_set: str, epochs: float) -> Iterator[str]:
    """Adapt the draft at `dpath` to the target at `tpath` (with its adapters `lora`) on the
    prompts of `prompts_file` (empty: the user's history), yielding the progress and at the
    end the proof's table."""
    if tpath is None or dpath is None:
        yield "<p><b>Refused:</b> choose a target and a draft on disk first (steps 1, 2 and 4).</p>"
        return
    tcfg, dcfg = ModelConfig(str(tpath), lora=lora), ModelConfig(str(dpath))
    settings = Settings(train=train_set, epochs=int(epochs))
    shown = Shown()

    def work() -> None:
        try:
            prompts = runtime.user_prompts(prompts_file.strip() or None, None, tcfg)
            shown.result = runtime.run_adapt(tcfg, dcfg, prompts, settings, None, shown)
            shown.lines += shown.result.lines
        except TandemError as exc:
            shown.error = str(exc)
        finally:
            shown.done = True

    thread = threading.Thread(target=work, name="tandem-adapt", daemon=True)
    thread.start()
    while thread.is_alive():
        yield shown.html()
        thread.join(POLL_S)
    yield shown.html()


class AdaptStep:
    """The tab's adapt step: its fields and button, laid out in the current Blocks."""

    def __init__(self) -> None:
        with gr.Group():
            gr.Markdown("### 6. Adapt the draft to the target (optional, minutes)")
            with gr.Row():
                self.prompts = gr.Textbox(label="prompts file (empty: your history's requests)",
                                          elem_id="wizard-adapt-prompts", scale=3)
                self.train = gr.Dropdown(list(CHOICES), value=Settings.train,
                                         label="what trains --train", scale=1)
                self.epochs = gr.Number(value=Settings.epochs, precision=0,
                                        label="epochs --epochs", scale=1)
            self.button = gr.Button("Adapt the draft", variant="secondary",
                                    elem_id="wizard-adapt")
            self.note = gr.HTML(elem_id="wizard-adapt-note")

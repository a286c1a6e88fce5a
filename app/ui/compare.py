"""The side-by-side tab: one prompt decoded plainly and then speculatively by the same target,
one run after the other (never two generations on the same cores at once), optionally
repeated N times with the median and spread of each measure.

Beside the result it states the machine's measured ceiling: the most a copy and the draft model
could gain over plain decoding on the verify curve the speculative run's drafter was calibrated
with, every drafted token accepted (bench/ceiling.py `reach`), with where that calibration came
from (kept by an earlier process, measured by this one, or measured on a busy machine and not
kept: loading/calibrations.py), and how the result compares, either side of 1.

In greedy mode the two outputs should match; where they do not, the first differing token is
reported: batched verification and one-token decoding give slightly different logits in
llama.cpp, so near-ties can flip (docs/EXACTNESS.md, "Numerics: batch width").
"""
from __future__ import annotations

import html
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Sequence

import gradio as gr

from app.ui import controls, metrics
from app.runtime.defaults import COPY_MAX, PLAIN
from app.runtime.holder import PairHolder
from app.runtime.request import RunSpec
from app.runtime.run import generate
from app.ui.state import StopFlags
from bench.benchmark.suite import FILE_EDITS, load_suite
from bench.ceiling import Reach, reach
from engine.control.costs import Calibration
from engine.errors import TandemError
from engine.events import DoneEvent, RoundEvent, TokenEvent
from engine.pair import Pair
from engine.stats import GenerationStats
from loading.calibrations import CalibrationFile, Origin

MAX_REPEATS = 10
MIN_REFRESH_S = 0.25
# The verify widths the ceiling's line quotes from the curve (those the calibration measured).
CURVE_WIDTHS = (2, 4, 8, 16, 32, 64)
# The prompt the tab opens with: fresh code, where a draft must guess.
FRESH_PROMPT = "Write a Python function that checks whether a string is a palindrome."


def example_prompts() -> list[str]:
    """The tab's examples: fresh code, and a whole-file edit (the first of the file-edit suite),
    where the answer copies most of the prompt and copies of up to 64 tokens can pay even on a
    CPU."""
    return [FRESH_PROMPT, load_suite(FILE_EDITS).prompts[0].prompt]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token, or None when the sequences are identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        return cls(statistics.median(values), min(values), max(values))

    def show(self, fmt: str = "{:.2f}") -> str:
        m = fmt.format(self.median)
        return m if self.low == self.high else f"{m} ({fmt.format(self.low)}–{fmt.format(self.high)})"


@dataclass
class Runs:
    plain: list[DoneEvent] = field(default_factory=list)
    speculative: list[DoneEvent] = field(default_factory=list)
    plain_pieces: list[metrics.Piece] = field(default_factory=list)
    speculative_pieces: list[metrics.Piece] = field(default_factory=list)

    def measures(self, mode: str) -> dict[str, Spread]:
        runs = [d.stats for d in (self.plain if mode == "plain" else self.speculative)]
        return {"tokens_per_s": Spread.of([s.tokens_per_s for s in runs]),
                "total_ms": Spread.of([s.total_time_ms for s in runs]),
                "ttft_ms": Spread.of([s.ttft_ms for s in runs])}

    def speedups(self) -> tuple[Spread, Spread]:
        """Per repeat: speculative over plain tokens/s, and plain over speculative end-to-end."""
        pairs = list(zip(self.plain, self.speculative))
        tps = [s.stats.tokens_per_s / b.stats.tokens_per_s for b, s in pairs if b.stats.tokens_per_s > 0]
        e2e = [b.stats.total_time_ms / s.stats.total_time_ms for b, s in pairs if s.stats.total_time_ms > 0]
        return Spread.of(tps or [0.0]), Spread.of(e2e or [0.0])

    def differences(self) -> list[int | None]:
        return [first_difference(b.tokens, s.tokens) for b, s in zip(self.plain, self.speculative)]


@dataclass(frozen=True)
class MachineCeiling:
    """The speculative run's drafter's ceiling on this machine: its calibration (None: none
    yet), what that curve lets a copy and the draft model reach, and where it came from (None:
    this pair keeps no calibrations)."""
    drafter: str
    calibration: Calibration | None = None
    reach: Reach | None = None
    origin: Origin | None = None

    def curve(self) -> list[tuple[int, float]]:
        """(width, cost relative to one token) at the quoted widths the calibration measured."""
        cal = self.calibration
        if cal is None:
            return []
        measured = set(cal.verify_widths or range(1, len(cal.verify_ms) + 1))
        one = cal.verify_ms[0]
        return [(w, round(cal.verify_ms[w - 1] / one, 2)) for w in CURVE_WIDTHS if w in measured]

    def as_dict(self) -> dict[str, Any]:
        r, o = self.reach, self.origin
        return {"drafter": self.drafter, "calibrated": r is not None,
                "copy_gamma": r.copy_gamma if r else None, "copy": r.copy if r else None,
                "model_gamma": r.model_gamma if r else None, "model": r.model if r else None,
                "curve": self.curve(), "measured": o.measured if o else None,
                "kept": str(o.kept) if o and o.kept else None,
                "earlier_process": o.earlier if o else None,
                "not_kept": o.not_kept if o else None}


def machine_ceiling(pair: Pair, calibrations: CalibrationFile | None, drafter: str,
                    max_gamma: int) -> MachineCeiling:
    """`drafter`'s ceiling from the calibration it runs with in this process: copies up to the
    longest a copy drafts, the draft model up to `max_gamma`."""
    if drafter not in pair.knowledge:
        return MachineCeiling(drafter)
    cal = pair.knowledge[drafter]
    return MachineCeiling(drafter, cal, reach(cal, COPY_MAX, max_gamma),
                          calibrations.origin(drafter) if calibrations is not None else None)


def _origin_words(origin: Origin | None) -> str:
    if origin is None:
        return "measured by this process and not kept (this pair keeps no calibrations)"
    when = origin.measured or "before kept calibrations said when"
    if origin.earlier:
        return f"kept in {origin.kept} by an earlier process, measured {when}"
    if origin.kept is not None:
        return f"measured by this process at {when}, kept in {origin.kept}"
    return (f"measured by this process at {when} and not kept ({origin.not_kept}); the next "
            "process measures again")


def ceiling_words(c: MachineCeiling, speedup: float) -> list[str]:
    """The ceiling, where it came from and how the run's `speedup` over plain compares, in
    lines; where no calibration is there yet, that alone."""
    r = c.reach
    if r is None or c.calibration is None:
        return [f"no calibration of {c.drafter} on this machine yet, so no measured ceiling to "
                "set this result beside"]
    widest = len(c.calibration.verify_ms)
    model = (f"; the draft model {r.model:.2f}x at gamma {r.model_gamma}"
             if r.model is not None else "")
    short = f" (calibrated to {widest} tokens only)" if widest <= COPY_MAX else ""
    lines = [f"ceiling on this machine, every drafted token accepted: a copy of {r.copy_gamma} "
             f"tokens {r.copy:.2f}x plain{short}{model}"]
    curve = ", ".join(f"{w}: {v:.2f}" for w, v in c.curve())
    lines.append(f"from {c.drafter}'s calibration, {_origin_words(c.origin)}"
                 + (f"; its verify curve, w tokens in one-token decodes: {curve}" if curve else ""))
    side = "faster than" if speedup > 1 else "as fast as" if speedup == 1 else "slower than"
    verdict = f"this run: {speedup:.2f}x, {side} plain decoding, {speedup / r.best:.0%} of the ceiling"
    if r.best <= 1:
        verdict += "; here even every drafted token accepted cannot beat plain decoding"
    elif speedup > r.best:
        verdict += ("; above it: the calibration's timings are not the machine's pace now (it "
                    "was busy then, or is now)")
    return [*lines, verdict]


def _identity_note(runs: Runs, greedy: bool) -> tuple[str, bool | None, int | None]:
    diffs = runs.differences()
    if not greedy:
        return ("sampling (temperature > 0): the two outputs are different samples of the same "
                "distribution, so they are not expected to match"), None, None
    first = next((d for d in diffs if d is not None), None)
    if first is None:
        return f"greedy: the outputs are identical in all {len(diffs)} repeat(s)", True, None
    n_diff = sum(d is not None for d in diffs)
    return (f"greedy: the outputs first differ at output token {first} ({n_diff} of {len(diffs)} "
            "repeat(s) differ); llama.cpp's batched verification and one-token decoding give "
            "slightly different logits, so near-ties can flip (numerics, not the algorithm)"), False, first


def summary_html(runs: Runs, greedy: bool, ceiling: MachineCeiling | None = None) -> str:
    if not runs.speculative:
        return '<div class="tandem-compare-summary" style="opacity:.7">running…</div>'
    base, spec = runs.measures("plain"), runs.measures("speculative")
    tps_up, e2e_up = runs.speedups()
    note, _, _ = _identity_note(runs, greedy)
    n = len(runs.speculative)
    rows = [("tokens/s", "tokens_per_s", "{:.2f}"), ("end-to-end ms", "total_ms", "{:.0f}"),
            ("TTFT ms", "ttft_ms", "{:.0f}")]
    cell = 'style="padding:4px 10px;border-bottom:1px solid rgba(128,128,128,.3)"'
    body = "".join(f"<tr><td {cell}>{label}</td><td {cell}>{base[key].show(fmt)}</td>"
                   f"<td {cell}>{spec[key].show(fmt)}</td></tr>" for label, key, fmt in rows)
    acc = Spread.of([d.stats.acceptance_rate * 100 for d in runs.speculative]).show("{:.0f}")
    ceiling_lines = "".join(f"<div>{html.escape(line)}</div>"
                            for line in ceiling_words(ceiling, tps_up.median)) if ceiling else ""
    return (f'<div class="tandem-compare-summary"><div style="font-size:1.3em;font-weight:600">'
            f'speedup {tps_up.show("{:.2f}")}× tokens/s · {e2e_up.show("{:.2f}")}× end-to-end</div>'
            f'<div style="font-size:.8em;opacity:.75">median (min–max) over {n} repeat(s); '
            f'draft acceptance {acc}%{_prediction_note(runs)}</div>'
            f'<div class="tandem-compare-ceiling" style="margin-top:4px">{ceiling_lines}</div>'
            f'<table style="margin-top:6px;border-collapse:collapse"><tr><th {cell}></th>'
            f'<th {cell}>plain</th><th {cell}>speculative</th></tr>{body}</table>'
            f'<div style="margin-top:6px">{html.escape(note)}</div></div>')


def _prediction_note(runs: Runs) -> str:
    """The prediction's share of the speculative runs, when they drafted from one."""
    last = runs.speculative[-1].stats
    seen = last.accepted_prediction_tokens + last.rejected_prediction_tokens
    if not seen:
        return ""
    return (f"; predicted output: {last.accepted_prediction_tokens} tokens accepted, "
            f"{last.rejected_prediction_tokens} rejected")


def payload(runs: Runs, greedy: bool, ceiling: MachineCeiling | None = None) -> dict[str, Any]:
    _, identical, first = _identity_note(runs, greedy)
    tps_up, e2e_up = runs.speedups() if runs.speculative else (Spread(0, 0, 0), Spread(0, 0, 0))
    return {"plain": [{"text": d.text, **d.stats.as_dict()} for d in runs.plain],
            "speculative": [{"text": d.text, **d.stats.as_dict()} for d in runs.speculative],
            "greedy": greedy, "identical": identical, "first_difference": first,
            "speedup_tokens_per_s": tps_up.median, "speedup_end_to_end": e2e_up.median,
            "ceiling": ceiling.as_dict() if ceiling is not None else None}


def _column(title: str, pieces: list[metrics.Piece], stats: GenerationStats | None, done: bool) -> str:
    return (f'<div style="font-weight:600;margin-bottom:4px">{html.escape(title)}</div>'
            f'{metrics.live_panel(stats, done=done)}{metrics.token_view(pieces)}')


def compare(holder: PairHolder, flags: StopFlags, session: str, prompt: str,
            spec: RunSpec, repeats: int) -> Iterator[tuple[str, str, str, dict | None]]:
    """Yield (plain column, speculative column, summary, results) as the runs progress."""
    if not prompt or not prompt.strip():
        raise gr.Error("type a prompt first")
    if not 1 <= repeats <= MAX_REPEATS:
        raise gr.Error(f"repeats must be between 1 and {MAX_REPEATS}, got {repeats}")
    if spec.drafter == PLAIN:
        raise gr.Error("pick a drafter for the speculative run; the plain run needs none")
    try:
        pair = holder.pair
    except TandemError as exc:
        raise gr.Error(str(exc)) from None
    specs = {"speculative": replace(spec, prompt=prompt)}
    specs["plain"] = specs["speculative"].plain()
    greedy = spec.sampling.greedy
    runs = Runs()
    state: dict[str, tuple[GenerationStats | None, bool]] = {"plain": (None, False), "speculative": (None, False)}

    def view() -> tuple[str, str, str, dict | None]:
        # The calibration the speculative runs used (made by the first of them, when none was).
        ceiling = machine_ceiling(pair, holder.calibrations, spec.drafter, spec.gamma) if runs.speculative else None
        return (_column("plain decoding (target alone)", runs.plain_pieces, *state["plain"]),
                _column(f"speculative ({spec.drafter})", runs.speculative_pieces, *state["speculative"]),
                summary_html(runs, greedy, ceiling), payload(runs, greedy, ceiling) if ceiling else None)

    flags.begin(session)
    try:
        # All the runs take one turn of the queue shared with the API: nothing runs between them.
        with holder.queue.slot():
            if spec.grammar is not None:
                pair.compile_grammar(spec.grammar)
            for i in range(repeats):
                for mode in ("plain", "speculative"):
                    pieces = runs.plain_pieces if mode == "plain" else runs.speculative_pieces
                    pieces.clear()
                    state[mode] = (None, False)
                    events = generate(pair, specs[mode])
                    last = time.monotonic()
                    try:
                        for ev in events:
                            if isinstance(ev, TokenEvent):
                                pieces.append(metrics.Piece(ev.text, ev.origin))
                            elif isinstance(ev, RoundEvent):
                                state[mode] = (ev.stats, False)
                                if flags.stopped(session):
                                    raise gr.Error(f"stopped during repeat {i + 1}")
                                if time.monotonic() - last >= MIN_REFRESH_S:
                                    last = time.monotonic()
                                    yield view()
                            elif isinstance(ev, DoneEvent):
                                state[mode] = (ev.stats, True)
                                (runs.plain if mode == "plain" else runs.speculative).append(ev)
                    finally:
                        events.close()
                    yield view()
    except TandemError as exc:
        raise gr.Error(str(exc)) from None
    finally:
        flags.end(session)


def build(holder: PairHolder, flags: StopFlags, drafters: list[str], default_drafter: str) -> dict[str, Any]:
    with gr.Row():
        prompt = gr.Textbox(label="prompt", lines=3, scale=5, elem_id="compare-prompt",
                            value=FRESH_PROMPT)
        with gr.Column(scale=1):
            repeats = gr.Slider(1, MAX_REPEATS, value=1, step=1, label="repeats",
                                info="runs of each; median and spread")
            run = gr.Button("Run plain, then speculative", variant="primary", elem_id="compare-run")
            stop = gr.Button("Stop", variant="stop", elem_id="compare-stop")
    with gr.Accordion("settings", open=False, elem_id="compare-settings"):
        widgets = controls.build(drafters, default_drafter, "compare", compare=True)
        output = controls.build_output("compare")
        prediction = controls.build_prediction("compare")
    gr.Examples([[p] for p in example_prompts()], [prompt], label="examples: fresh code, a whole-file edit",
                elem_id="compare-examples")
    summary = gr.HTML(summary_html(Runs(), True), elem_id="compare-summary")
    with gr.Row():
        left = gr.HTML(_column("plain decoding (target alone)", [], None, False), elem_id="compare-plain")
        right = gr.HTML(_column("speculative", [], None, False), elem_id="compare-spec")
    with gr.Accordion("raw results", open=False):
        results = gr.JSON(label="results", elem_id="compare-results")

    def on_run(prompt_text: str, n: float, drafter: str, policy: str, gamma: float, temperature: float,
               top_k: float, top_p: float, min_p: float, seed: float | None, max_tokens: float,
               output_choice: str, schema: str, predicted: str, request: gr.Request):
        try:
            spec = controls.spec(holder.offer(), drafter, policy, gamma, temperature, top_k,
                                 top_p, min_p, seed, max_tokens, output=output_choice,
                                 schema=schema, prediction=predicted)
        except TandemError as exc:
            raise gr.Error(str(exc)) from None
        yield from compare(holder, flags, request.session_hash or "", prompt_text, spec, int(n))

    run.click(on_run, [prompt, repeats, *widgets, *output, prediction], [left, right, summary, results], api_name="compare",
              concurrency_limit=None, show_progress="hidden")
    def on_stop(request: gr.Request) -> None:
        flags.stop(request.session_hash or "")

    stop.click(on_stop, None, None, api_name="stop_compare", queue=False)
    return dict(zip(controls.WIDGETS, widgets))

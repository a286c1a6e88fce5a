"""The one way every command opens a pair: `open_pair(PairRequest)` runs the load sequence
that `tandem generate`, `serve`, `ui` (the pair holder), `bench`, `exactness`, `calibrate`,
`tune` and the page's ceiling share:

    pairing record -> plan -> print the plan -> execute -> evidence, calibrations -> history

The request is a plain value (files, load options, how the pairing record is treated, the
drafters' lookup and stop settings, the history size, where the lines go); the CLI modules
build it from their options, the page from its fields. A command that measures drafters itself
does not use the record (nor the evidence kept beside it) and says so with the plan; every
command starts from the calibrations kept for its files and settings (loading/calibrations.py).
`served_file` answers, by the same plan, which file a load of a draft reads (what `tandem adapt`
measures).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from app.runtime.defaults import DEFAULT_CHAIN_MIN, LOOKUP_NGRAM, NEEDS_DRAFT_MODEL
from app.runtime.tuned import (COMMAND, PAGE, PairingRule, PairingUse, for_command, for_load,
                               key_for, lookup)
from engine.backend import ModelConfig
from engine.pair import Pair
from loading.calibrations import CalibrationFile, keep_calibrations
from loading.evidence import keep_evidence
from loading.history import HistoryStore
from loading.derived.quantized import Quantizer
from loading.load import Announce, Loader, Progress, execute, served_draft
from loading.options import LoadOptions
from loading.plan import LoadPlan, plan_load

# Where a load's lines go (`PairRequest.say`): the process's stream of that name, looked up
# when printing; QUIET prints nothing (the page shows them in its status instead).
STDERR, STDOUT, QUIET = "stderr", "stdout", ""


@dataclass(frozen=True)
class PairRequest:
    """What to open: the target and the draft (None: no draft model), what the load checks
    and derives, how the pairing record is treated, the pair's prompt-lookup and draft-stop
    settings, the history's size (None: no history), where the load's lines go, and whether
    the drafters are measured anew rather than started from their kept calibrations (they are
    kept either way)."""
    target: ModelConfig
    draft: ModelConfig | None
    options: LoadOptions = LoadOptions()
    pairing: PairingRule = PairingRule()
    lookup_ngram: int = LOOKUP_NGRAM
    p_min: float = 0.0
    chain_min: float = DEFAULT_CHAIN_MIN
    history_tokens: int | None = None
    say: str = STDERR
    remeasure: bool = False


@dataclass
class OpenedPair:
    """A loaded pair with what its command needs beside it: the plan it was loaded by (where
    the layers went, the headers read), the pairing record found and whether it applied, and
    the history store for the target's vocabulary (None when off), and the file the drafters'
    calibrations are kept in."""
    pair: Pair
    plan: LoadPlan
    pairing: PairingUse
    history: HistoryStore | None = None
    calibrations: CalibrationFile | None = None


def plan_lines(plan: LoadPlan) -> list[str]:
    """The plan as printed: where the load puts everything, in one line."""
    return [f"offload: {plan.offload.line()}"] if plan.offload is not None else []


def print_plan(plan: LoadPlan) -> None:
    """Print the plan's line on stderr (an `Announce`, for the pair holder of `tandem ui`)."""
    for line in plan_lines(plan):
        print(line, file=sys.stderr, flush=True)


def _say(where: str, lines: list[str]) -> None:
    if where == QUIET:
        return
    stream = {STDERR: sys.stderr, STDOUT: sys.stdout}[where]
    for line in lines:
        print(line, file=stream, flush=True)


def _pairing(request: PairRequest) -> tuple[PairingUse, ModelConfig | None, LoadOptions]:
    """The record for the request's files, applied by its rule, with the draft and the load
    options it leaves; an ignored record is said to be ignored."""
    rule, draft, options = request.pairing, request.draft, request.options
    if not rule.looks_up:
        return PairingUse(messages=[rule.not_used_line()]), draft, options
    if rule.mode == PAGE:
        options, use = for_load(request.target, draft, options)
        return use, use.draft_config(draft), options
    assert rule.mode == COMMAND, rule.mode
    use = for_command(lookup(request.target, draft), rule.chose_speculation, rule.no_pairing)
    if use.drafter is not None and use.drafter not in NEEDS_DRAFT_MODEL:
        # The record's drafter does not use the draft model: it is not loaded.
        draft = None
    return use, use.draft_config(draft), use.load_options(options)


def open_pair(request: PairRequest, loader: Loader | None = None,
              progress: Progress | None = None, announce: Announce | None = None) -> OpenedPair:
    """Run the load sequence for `request`: find (or ignore) the pairing record and apply it
    by the request's rule, plan the load (files, compatibility, memory, derivations), print the
    record's lines and the plan, let `announce` hear (and check) the plan before anything
    loads, execute it, let the drafters start from the evidence and the calibrations kept for
    the files, and open the history store. `loader` stands in for llama.cpp's, `progress` hears each model before
    it loads. A step that fails after the models are up closes them before raising."""
    use, draft, options = _pairing(request)
    _say(request.say, use.messages)
    plan = plan_load(request.target, draft, options)
    _say(request.say, plan_lines(plan))
    if announce is not None:
        announce(plan)
    pair = execute(plan, loader=loader, progress=progress, lookup_ngram=request.lookup_ngram,
                   p_min=request.p_min, chain_min=request.chain_min)
    try:
        if use.key is not None:
            keep_evidence(pair, use.key)
        # The files are loaded, so they are there to be keyed even where no record was looked up.
        d = plan.draft
        key = use.key or key_for(plan.target.path, d.path if d else None, plan.target.lora,
                                 d.lora if d else ())
        calibrations = keep_calibrations(pair, key, plan, reuse=not request.remeasure)
        history = (HistoryStore.for_model(plan.target_info, request.history_tokens)
                   if request.history_tokens is not None else None)
    except BaseException:
        pair.close()
        raise
    return OpenedPair(pair, plan, use, history, calibrations)


def served_file(tcfg: ModelConfig, quantizer: Quantizer | None = None
                ) -> Callable[[Path, str], Path]:
    """serve(draft, draft_quant): the file a load of `draft` beside `tcfg` reads, as the loader
    plans and derives it (loading/load.py `served_draft`: under "auto", a heavy draft on the CPU
    is its Q4_0 copy), so that the proof measures what will be served."""
    def serve(draft: Path, draft_quant: str) -> Path:
        plan = plan_load(tcfg, ModelConfig(path=str(draft), n_ctx=tcfg.n_ctx),
                         LoadOptions(draft_quant=draft_quant, check_budget=False, warmup=False))
        cfg = served_draft(plan, quantizer)
        return Path(cfg.path) if cfg is not None else draft
    return serve

"""Building and proving the adapted draft, and keeping the verdict: first the base draft's
acceptance on the user's requests (`declined`: a pair that leaves too little to gain is declined
before anything else is answered or trained, unless the run is forced), then training into the store (loading/derived/adapted.py), base against
adapted on the held-out prompts (bench/adapt/proof.py) with each file as it will be served
(requantized as the loader will, with the pair's own `draft_quant`: `serve`, the app's
loading plan), the gate (bench/adapt/run.py `decide`), and the pairing record's `adapted` entry
(models/tuned.py), which names the file and says whether it won.

Beside the table, a cheap check of the trainer: its own accuracy on its windows
(`ggml_opt_result_accuracy`) in the first and last epoch, against the trained answers'
agreement measured in their own context before and after.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from bench.adapt import data, proof, run, train
from bench.adapt.data import Example
from bench.adapt.settings import Settings
from engine.backend import Backend, ModelConfig
from engine.llama.backend import LlamaBackend, quiet_backend
from loading.derived.adapted import derive_adapted
from models.candidate import Candidate
from models.gguf_info import GGUFInfo
from models.tuned import AdaptedDraft, PairingRecord, PairKey, find, save

CPU_PROMPTS = 3
# serve(draft file, draft_quant) -> the file a load of it reads (app/runtime/adapt.py
# `served_file`: the loader's own plan and derivation).
Serve = Callable[[Path, str], Path]
# Trained answers the trainer check decodes in their own context, base and adapted.
CHECK_EXAMPLES = 8


@dataclass
class Result:
    path: Path | None  # None: declined before training
    wins: bool
    lines: list[str] = field(default_factory=list)


def _generate(target: Backend, draft: Backend, prompt: Sequence[int], temperature: float
              ) -> tuple[int, float]:
    """(tokens, seconds) of one speculative answer at fixed gamma, as the engine's own stats
    measure it (the CPU's measured speed)."""
    from engine.control.policy import FixedGamma
    from engine.events import DoneEvent
    from engine.generation_config import GenerationConfig
    from engine.pair import Pair
    from engine.sampling import SamplingParams
    pair = Pair(target, draft)
    config = GenerationConfig(params=SamplingParams(temperature=temperature, seed=run.SEED),
                              gamma=proof.GAMMA, max_tokens=run.HELD_OUT_TOKENS)
    done = [ev for ev in pair.generate_tokens(list(prompt), config, drafter="draft",
                                              policy=FixedGamma(proof.GAMMA))
            if isinstance(ev, DoneEvent)][0]
    return done.stats.output_tokens, done.stats.total_time_ms / 1e3


def _own_argmax(draft: Backend) -> Callable[[list[int]], list[int]]:
    """The draft's own argmax at every position of a window (data.py `with_own_labels`)."""
    def own(tokens: list[int]) -> list[int]:
        draft.truncate(0)
        rows = draft.decode(tokens, 0, list(range(len(tokens))))
        return [int(t) for t in np.argmax(rows, axis=1)]
    return own


def _train(dinfo: GGUFInfo, key: PairKey, trained: list[Example], settings: Settings,
           threads: int, step: Callable[[train.Step], None]
           ) -> tuple[Path, str, list[str], list[train.Step]]:
    from engine.llama.training import Trainer
    data_sha = data.data_sha256(trained)
    pad = dinfo.eos_id if dinfo.eos_id is not None else 0
    windows = data.windows(trained, settings.context, pad)
    scored = sum(sum(w.scored) for w in windows) / max(len(windows) * settings.context, 1)
    lines = [f"teacher data: {len(trained)} answers, one window of {settings.context} tokens "
             f"each ({scored:.0%} of positions are answer labels, the rest the draft's own "
             f"argmax); training {settings.train} at lr {settings.lr:g} for {settings.epochs} "
             "epochs"]
    steps: list[train.Step] = []
    start = time.monotonic()

    def build(work: Path, out: Path) -> None:
        with _load(str(dinfo.path), threads) as d:
            labelled = data.with_own_labels(windows, _own_argmax(d))
        steps.extend(train.train_draft(
            dinfo, labelled, out, work, settings.train, settings.epochs, settings.lr,
            lambda p, n, t, lr: Trainer(p, n, t, lr, threads), step))

    path = derive_adapted(dinfo.path, key.target_sha256, key.adapter_sha256, data_sha, build)
    if steps:
        lines.append(f"trained in {time.monotonic() - start:.0f} s; "
                     + run.losses_line([s.loss for s in steps], settings.epochs))
    else:
        lines.append("the adapted draft for this data was already in the store")
    return path, data_sha, lines, steps


def _load(path: str, threads: int, lora: tuple = ()) -> LlamaBackend:
    return quiet_backend(ModelConfig(path=path, n_ctx=2048, n_threads=threads, lora=lora))


def trainer_check(steps: Sequence[train.Step], epochs: int, base: float, adapted: float
                  ) -> str:
    """The trainer's accuracy on its windows, first epoch and last, beside the in-context
    agreement of the trained answers, base and adapted."""
    per = np.array_split(np.asarray([s.accuracy for s in steps]), max(epochs, 1))
    first, last = float(per[0].mean()), float(per[-1].mean())
    line = (f"trainer check: its accuracy on its windows {first:.3f} -> {last:.3f} (every "
            f"position, ggml_opt_result_accuracy); the trained answers' agreement in context "
            f"{base:.3f} -> {adapted:.3f}")
    if (last - first) - (adapted - base) > run.MAX_LOSS:
        line += " (the trainer fits its windows more than decoding gains)"
    return line


def _quant(tcfg: ModelConfig, dcfg: ModelConfig, key: PairKey, default: Candidate
           ) -> tuple[PairingRecord, str]:
    """The pair's record (a new one with `default` if none) and the draft_quant it loads with."""
    record = find(key) or _new_record(tcfg, dcfg, key, default)
    return record, record.chosen.candidate.draft_quant


def declined(tcfg: ModelConfig, dcfg: ModelConfig, key: PairKey, default: Candidate,
             serve: Serve, mine: Sequence[Example], above: float, threads: int) -> str | None:
    """The line that declines the run where the base draft, as served, already accepts more
    than `above` per position at greedy on the user's requests `mine` (their greedy answers);
    None where adapting it is worth a try."""
    base_path = serve(Path(dcfg.path), _quant(tcfg, dcfg, key, default)[1])
    greedy = [e for e in mine if e.temperature == 0]
    with _load(str(base_path), threads) as base:
        r = proof.greedy_rounds(base, greedy)
    if r.mean_acceptance <= above:
        return None
    return (f"declined: the base draft ({base_path.name}) already accepts "
            f"{r.mean_acceptance:.3f} per position at greedy on {len(greedy)} of your requests, "
            f"above {above:.2f}: too little left to gain (force it to train anyway)")


def adapt(tcfg: ModelConfig, dcfg: ModelConfig, dinfo: GGUFInfo, key: PairKey,
          trained: list[Example], held: list[Example], settings: Settings, threads: int,
          step: Callable[[train.Step], None], default: Candidate, serve: Serve) -> Result:
    """Train (or reuse) the adapted draft, prove it on `held` as served, and keep the verdict
    in the pairing record of `key` (made with the `default` configuration if the pair has
    none)."""
    record, quant = _quant(tcfg, dcfg, key, default)
    base_path = serve(Path(dcfg.path), quant)
    path, data_sha, lines, steps = _train(dinfo, key, trained, settings, threads, step)
    if steps:
        sample = trained[:CHECK_EXAMPLES]
        with _load(dcfg.path, threads) as b, _load(str(path), threads) as a:
            lines.append(trainer_check(steps, settings.epochs, proof.agreement(b, sample),
                                       proof.agreement(a, sample)))
    adapted_path = serve(path, quant)
    lines.append(f"measured as served (draft_quant {quant}): {base_path.name} against "
                 f"{adapted_path.name}")
    with _load(tcfg.path, threads, tcfg.lora) as tb, _load(str(base_path), threads) as base, \
            _load(str(adapted_path), threads) as ad:
        drafts = {"base": base, "adapted": ad}
        results = proof.measure(tb, drafts, held)
        cats = list(dict.fromkeys(e.category for e in held))
        table = run.rows(results, cats)
        yours = [e for e in held if e.category == run.YOURS and e.temperature == 0]
        cpu = run.cpu_speed(tb, drafts, yours[:CPU_PROMPTS], _generate)
    wins, reason = run.decide(table, cpu)
    lines += run.table_lines(table, cpu) + [reason]
    record.adapted = AdaptedDraft(path.name, key.target_sha256, key.adapter_sha256,
                                  key.draft_sha256, data_sha, settings.train, wins, reason,
                                  tuple(lines))
    save(record)
    return Result(path, wins, lines)


def _new_record(tcfg: ModelConfig, dcfg: ModelConfig, key: PairKey,
                default: Candidate) -> PairingRecord:
    """A record for a pair never tuned: the defaults as its choice (so it changes nothing but
    the draft file), measured by nothing but the adaptation."""
    from models.tuned import Choice
    lora = tcfg.lora
    return PairingRecord(key=key, target=tcfg.path, draft=dcfg.path,
                         adapter=lora[0][0] if lora else "",
                         adapter_scale=lora[0][1] if lora else 1.0,
                         chosen=Choice(default))

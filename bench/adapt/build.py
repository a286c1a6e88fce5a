"""Building and proving the adapted draft, and keeping the verdict: train into the store
(loading/derived/adapted.py), measure base against adapted on the held-out prompts
(bench/adapt/proof.py), and write the pairing record's `adapted` entry (models/tuned.py), which
names the file and says whether it won."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

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


@dataclass
class Result:
    path: Path
    wins: bool
    lines: list[str] = field(default_factory=list)


def _generate(target: Backend, draft: Backend, prompt: Sequence[int], temperature: float
              ) -> tuple[int, float]:
    """(tokens, seconds) of one speculative answer at fixed gamma (the CPU's measured speed)."""
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


def _train(dinfo: GGUFInfo, key: PairKey, trained: list[Example], settings: Settings,
           threads: int, step: Callable[[train.Step], None]) -> tuple[Path, str, list[str]]:
    from engine.llama.training import Trainer
    data_sha = data.data_sha256(trained)
    windows = data.windows(trained, settings.context)
    lines = [f"teacher data: {len(trained)} answers, {len(windows)} windows of {settings.context} "
             f"tokens; training {settings.train} for {settings.epochs} epochs"]
    losses: list[float] = []
    start = time.monotonic()

    def build(work: Path, out: Path) -> None:
        losses.extend(train.train_draft(
            dinfo, windows, out, work, settings.train, settings.epochs, settings.lr,
            lambda p, n, t, lr: Trainer(p, n, t, lr, threads), step))

    path = derive_adapted(dinfo.path, key.target_sha256, key.adapter_sha256, data_sha, build)
    if losses:
        lines.append(f"trained in {time.monotonic() - start:.0f} s; "
                     + run.losses_line(losses, settings.epochs))
    else:
        lines.append("the adapted draft for this data was already in the store")
    return path, data_sha, lines


def adapt(tcfg: ModelConfig, dcfg: ModelConfig, dinfo: GGUFInfo, key: PairKey,
          trained: list[Example], held: list[Example], settings: Settings, threads: int,
          step: Callable[[train.Step], None], default: Candidate) -> Result:
    """Train (or reuse) the adapted draft, prove it on `held`, and keep the verdict in the
    pairing record of `key` (made with the `default` configuration if the pair has none)."""
    path, data_sha, lines = _train(dinfo, key, trained, settings, threads, step)

    def load(p: str, lora: tuple = ()) -> LlamaBackend:
        return quiet_backend(ModelConfig(path=p, n_ctx=2048, n_threads=threads, lora=lora))

    with load(tcfg.path, tcfg.lora) as tb, load(dcfg.path) as base, load(str(path)) as ad:
        drafts = {"base": base, "adapted": ad}
        results = proof.measure(tb, drafts, held)
        cats = list(dict.fromkeys(e.category for e in held))
        table = run.rows(results, cats)
        mine = [e for e in held if e.category == run.YOURS and e.temperature == 0][:CPU_PROMPTS]
        cpu = run.cpu_speed(tb, drafts, mine, _generate)
    wins, reason = run.decide(table)
    lines += run.table_lines(table, cpu) + [reason]
    record = find(key) or _new_record(tcfg, dcfg, key, default)
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

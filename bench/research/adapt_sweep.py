"""Training settings for `tandem adapt`, compared on the teacher data a run cached: each setting
trains the embedded draft, and its greedy acceptance per position (teacher-forced, as the proof
measures it, bench/adapt/proof.py) is compared with the base draft's on the trained prompts
themselves ("in sample") and on the held-out ones.

  .venv/bin/python -m bench.research.adapt_sweep --data adapt-data-<hash>.npz
      --held adapt-data-<hash>.npz --prompts 40 NAME:TRAIN:LR:EPOCHS:LABELS[:OPT[:EPS]] ...

The two files are those `tandem adapt` wrote into the store's derived/ folder (the user's
prompts' answers, then the held-out suite's); `--prompts` is how many prompts the first holds.
`--teach FILE` instead answers a prompts file's requests greedy only (cached in derived/ like
`tandem adapt`'s data; every fourth is held out as "yours"), for teacher data larger than a run
makes in a user's wait; without `--held` the suite is then answered as `tandem adapt` answers
it, into the same file. `--steps 20,40` also measures the draft after those many steps, and
`--trained K` trains on the first K trained requests only (the same held-out ones).
LABELS says what each position is trained toward: `next` (the next token of the text), `prompt`
(the target's greedy choice in the prompt and the answer's next token after, as `tandem adapt`
trains since teacher data format 2), `target` (the target's greedy choice everywhere) or `masked`
(the target's greedy choice in the answers and the draft's own in the prompts, where llama.cpp's
trainer cannot leave a position out). The target's rows are computed once and kept in the runs
folder. OPT is `adamw` (the default) or `sgd`; EPS is AdamW's eps (default 1e-8).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from bench.adapt import data, proof, run, session
from bench.adapt.settings import Settings
from bench.benchmark.suite import load_suite
from engine.backend import ModelConfig
from engine.llama.backend import quiet_backend
from engine.llama import training
from engine.llama.training import Trainer
from engine.pair import Pair
from loading.derived.files import derived_dir
from loading.derived.trainable import trains, write_adapted, write_trainable
from models import embedded
from models.gguf_info import read_info
from models.tandem_store import sha256_of, tandem_home

LABELS = ("next", "prompt", "target", "masked")
OPTIMIZERS = {"adamw": training.ADAMW, "sgd": training.SGD}


def _argmax(path: Path, examples: list[data.Example]) -> list[np.ndarray]:
    """A model's greedy choice at every position of each example (teacher-forced)."""
    out = []
    with quiet_backend(ModelConfig(path=str(path), n_ctx=2048, n_threads=2)) as be:
        for e in examples:
            be.truncate(0)
            toks = e.tokens
            out.append(np.argmax(be.decode(toks, 0, list(range(len(toks) - 1))), axis=1))
    return out


def _windows(trained: list[data.Example], labels: list[np.ndarray], n_ctx: int
             ) -> list[tuple[list[int], list[int]]]:
    """The examples end to end in windows, as data.windows cut them before issue 63 (the setting
    this sweep measured), with the labels given (an example's last position keeps the next
    example's first token)."""
    toks = [t for e in trained for t in e.tokens]
    labs: list[int] = []
    for lab in labels:
        labs += [int(x) for x in lab] + [-1]
    labs = [toks[i + 1] if x == -1 and i + 1 < len(toks) else x for i, x in enumerate(labs)]
    return [(toks[i:i + n_ctx], labs[i:i + n_ctx]) for i in range(0, len(toks) - n_ctx, n_ctx)]


def _teach(prompts_file: str, target: Path, max_tokens: int, with_suite: bool
           ) -> tuple[list[data.Example], int, list[data.Example]]:
    """The target's greedy answers to a prompts file's requests (teacher data format 2), cached
    in derived/ by the prompts, the target and the length; how many prompts there were; and, `with_suite`,
    the held-out suite's answers as `tandem adapt` makes them with its default settings (the
    same file in derived/, so a run of either reuses the other's)."""
    target_sha = sha256_of(target)
    with quiet_backend(ModelConfig(path=str(target), n_ctx=2048, n_threads=2)) as tb:
        pair = Pair(tb)
        prompts = [(p.category, pair.tokens_for(p.prompt)) for p in load_suite(prompts_file).prompts]
        mine = data.cached(
            data.prompts_sha256(prompts, f"greedy|{target_sha}", run.SEED, max_tokens),
            derived_dir(), lambda: data.teach(
                tb, prompts, max_tokens, run.SEED, temperatures=(0.0,),
                progress=lambda i, n: print(f"# teacher {i}/{n}", flush=True)))
        held = session.held_suite(tb, pair.tokens_for, Settings(), target_sha) if with_suite else []
    return mine, len(prompts), held


def acceptance_of(draft_rows: Callable[[data.Example], np.ndarray], trained, held, target_rows,
                  in_sample: str = "in sample") -> dict[str, float]:
    """Mean acceptance per position by "category T<t>": greedy on the trained requests' own
    answers (`in_sample`), and on each held-out example against the target's rows; `draft_rows`
    gives a draft's logits at an example's answer positions (proof.rows)."""
    res: dict[tuple[str, float], proof.Rounds] = {}
    for e in trained:
        if e.temperature == 0:
            hit = np.argmax(draft_rows(e), axis=1) == np.asarray(e.answer)
            res.setdefault((in_sample, 0.0), proof.Rounds()).add(hit.astype(float))
    for e, rows in zip(held, target_rows):
        chances = proof.accept_chances(rows, draft_rows(e), e)
        res.setdefault((e.category, e.temperature), proof.Rounds()).add(chances)
    return {f"{c} T{t:g}": r.mean_acceptance for (c, t), r in res.items()}


def _acceptance(path: Path, trained, held, target_rows) -> dict[str, float]:
    with quiet_backend(ModelConfig(path=str(path), n_ctx=2048, n_threads=2)) as d:
        return acceptance_of(lambda e: proof.rows(d, e), trained, held, target_rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="teacher data in derived/ (or --teach)")
    ap.add_argument("--teach", help="a prompts file the target answers greedy (or --data)")
    ap.add_argument("--held", help="the held-out suite's answers in derived/ (with --teach, "
                    "default: made as `tandem adapt` makes them)")
    ap.add_argument("--prompts", type=int, help="how many prompts --data holds")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", default="", help="also measure after these steps, e.g. 20,40")
    ap.add_argument("--trained", type=int, help="train on the first this many trained requests")
    ap.add_argument("settings", nargs="+", help="NAME:TRAIN:LR:EPOCHS:LABELS[:OPT[:EPS]]")
    args = ap.parse_args(argv)
    if (args.data is None) == (args.teach is None) or (args.data and not (args.prompts and
                                                                           args.held)):
        ap.error("give --data with --prompts and --held, or --teach")
    checkpoints = {int(x) for x in args.steps.split(",") if x}
    target, draft = embedded.ensure()
    if args.teach:
        examples, n_prompts, suite = _teach(args.teach, target, data.ANSWER_TOKENS, not args.held)
        stem = f"adapt-data-{data.data_sha256(examples)[:16]}"
    else:
        examples, n_prompts = data.load(derived_dir() / args.data), args.prompts
        stem = Path(args.data).stem
    if args.held:
        suite = data.load(derived_dir() / args.held)
    trained, yours = run.split(examples, n_prompts)
    held = yours + suite
    cache = tandem_home() / "runs" / f"adapt-sweep-{stem}.npz"
    if not cache.is_file():
        cache.parent.mkdir(parents=True, exist_ok=True)
        with quiet_backend(ModelConfig(path=str(target), n_ctx=2048, n_threads=2)) as tb:
            rows = {f"r{i}": proof.rows(tb, e).astype(np.float32) for i, e in enumerate(held)}
        labs = _argmax(target, trained)
        data.save_arrays(cache, lens=np.array([len(x) for x in labs]),
                         labels=np.concatenate(labs), **rows)
    with np.load(cache) as f:
        target_rows = [f[f"r{i}"] for i in range(len(held))]
        target_labels = np.split(f["labels"], np.cumsum(f["lens"])[:-1])
    trained, target_labels = trained[:args.trained], target_labels[:args.trained]
    base = _acceptance(draft, trained, held, target_rows)
    print(json.dumps({"setting": "base", **{k: round(v, 3) for k, v in base.items()}}))
    own = _argmax(draft, trained) if any(s.endswith(":masked") for s in args.settings) else []
    info = read_info(draft)
    for spec in args.settings:
        name, train_set, lr, epochs, labels, *rest = spec.split(":")
        opt, eps = (rest + ["adamw", "1e-8"][len(rest):])[:2]
        assert labels in LABELS and opt in OPTIMIZERS, spec
        chosen = trains(train_set, info.n_layer)
        if labels == "next":
            windows = _windows(trained, [np.asarray(e.tokens[1:]) for e in trained],
                               args.context)
        else:
            labs = [t.copy() for t in target_labels]
            for e, lab, mine in zip(trained, labs, own if labels == "masked" else []):
                lab[:len(e.prompt) - 1] = mine[:len(e.prompt) - 1]
            for e, lab in zip(trained, labs if labels == "prompt" else []):
                lab[len(e.prompt) - 1:] = e.answer
            windows = _windows(trained, labs, args.context)
        with tempfile.TemporaryDirectory(dir=derived_dir(), prefix=".sweep-") as work:
            names = write_trainable(draft, Path(work) / "t.gguf", chosen)
            losses: list[float] = []
            seconds = 0.0  # training only: the checkpoints' measuring is left out
            total = int(epochs) * len(windows)

            def measure(t: Trainer) -> None:
                t.save(Path(work) / "trained.gguf")
                write_adapted(draft, Path(work) / "trained.gguf", Path(work) / "a.gguf", names)
                got = _acceptance(Path(work) / "a.gguf", trained, held, target_rows)
                print(json.dumps({
                    "setting": name, "train": train_set, "lr": float(lr), "epochs": int(epochs),
                    "labels": labels, "optimizer": opt, "eps": float(eps), "windows":
                    len(windows), "step": len(losses), "train_s": round(seconds),
                    "loss": run.losses_line(losses, max(1, round(len(losses) / len(windows)))),
                    **{k: round(got[k] - base[k], 3) for k in got}}), flush=True)

            with Trainer(Path(work) / "t.gguf", args.context, chosen, float(lr), 2,
                         eps=float(eps), optimizer=OPTIMIZERS[opt]) as t:
                for w, lab in windows * int(epochs):
                    start = time.monotonic()
                    losses.append(t.step(w, lab)[0])
                    seconds += time.monotonic() - start
                    if len(losses) in checkpoints and len(losses) < total:
                        measure(t)
                measure(t)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

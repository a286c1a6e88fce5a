"""Training settings for `tandem adapt`, compared on the teacher data a run cached: each setting
trains the embedded draft, and its greedy acceptance per position (teacher-forced, as the proof
measures it, bench/adapt/proof.py) is compared with the base draft's on the trained prompts
themselves ("in sample") and on the held-out ones.

  .venv/bin/python -m bench.research.adapt_sweep --data adapt-data-<hash>.npz
      --held adapt-data-<hash>.npz --prompts 40 NAME:TRAIN:LR:EPOCHS:LABELS[:OPT[:EPS]] ...

The two files are those `tandem adapt` wrote into the store's derived/ folder (the user's
prompts' answers, then the held-out suite's); `--prompts` is how many prompts the first holds.
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
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.adapt import data, proof, run
from engine.backend import ModelConfig
from engine.llama.backend import quiet_backend
from engine.llama import training
from engine.llama.training import Trainer
from loading.derived.files import derived_dir
from loading.derived.trainable import trains, write_adapted, write_trainable
from models import embedded
from models.gguf_info import read_info
from models.tandem_store import tandem_home

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


def _windows(trained: list[data.Example], labels: list[np.ndarray], n_ctx: int) -> list[data.Window]:
    """The examples end to end in windows, as data.windows cuts them, with the labels given
    (an example's last position keeps the next example's first token)."""
    toks = [t for e in trained for t in e.tokens]
    labs: list[int] = []
    for lab in labels:
        labs += [int(x) for x in lab] + [-1]
    labs = [toks[i + 1] if x == -1 and i + 1 < len(toks) else x for i, x in enumerate(labs)]
    return [(toks[i:i + n_ctx], labs[i:i + n_ctx]) for i in range(0, len(toks) - n_ctx, n_ctx)]


def _acceptance(path: Path, trained, held, target_rows) -> dict[str, float]:
    res: dict[tuple[str, float], proof.Rounds] = {}
    with quiet_backend(ModelConfig(path=str(path), n_ctx=2048, n_threads=2)) as d:
        for e in trained:
            if e.temperature == 0:
                hit = np.argmax(proof.rows(d, e), axis=1) == np.asarray(e.answer)
                res.setdefault(("in sample", 0.0), proof.Rounds()).add(hit.astype(float))
        for e, rows in zip(held, target_rows):
            chances = proof.accept_chances(rows, proof.rows(d, e), e)
            res.setdefault((e.category, e.temperature), proof.Rounds()).add(chances)
    return {f"{c} T{t:g}": r.mean_acceptance for (c, t), r in res.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--held", required=True)
    ap.add_argument("--prompts", type=int, required=True)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("settings", nargs="+", help="NAME:TRAIN:LR:EPOCHS:LABELS[:OPT[:EPS]]")
    args = ap.parse_args(argv)
    target, draft = embedded.ensure()
    trained, yours = run.split(data.load(derived_dir() / args.data), args.prompts)
    held = yours + data.load(derived_dir() / args.held)
    cache = tandem_home() / "runs" / f"adapt-sweep-{Path(args.data).stem}.npz"
    if not cache.is_file():
        cache.parent.mkdir(parents=True, exist_ok=True)
        with quiet_backend(ModelConfig(path=str(target), n_ctx=2048, n_threads=2)) as tb:
            rows = {f"r{i}": proof.rows(tb, e).astype(np.float32) for i, e in enumerate(held)}
        labs = _argmax(target, trained)
        np.savez(cache, lens=[len(x) for x in labs], labels=np.concatenate(labs), **rows)
    with np.load(cache) as f:
        target_rows = [f[f"r{i}"] for i in range(len(held))]
        target_labels = np.split(f["labels"], np.cumsum(f["lens"])[:-1])
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
            windows = data.windows([replace(e, choices=()) for e in trained], args.context)
        else:
            labs = [t.copy() for t in target_labels]
            for e, lab, mine in zip(trained, labs, own if labels == "masked" else []):
                lab[:len(e.prompt) - 1] = mine[:len(e.prompt) - 1]
            for e, lab in zip(trained, labs if labels == "prompt" else []):
                lab[len(e.prompt) - 1:] = e.answer
            windows = _windows(trained, labs, args.context)
        with tempfile.TemporaryDirectory(dir=derived_dir(), prefix=".sweep-") as work:
            names = write_trainable(draft, Path(work) / "t.gguf", chosen)
            start, losses = time.monotonic(), []
            with Trainer(Path(work) / "t.gguf", args.context, chosen, float(lr), 2,
                         eps=float(eps), optimizer=OPTIMIZERS[opt]) as t:
                for _ in range(int(epochs)):
                    losses += [t.step(w, lab) for w, lab in windows]
                t.save(Path(work) / "trained.gguf")
            seconds = time.monotonic() - start
            write_adapted(draft, Path(work) / "trained.gguf", Path(work) / "a.gguf", names)
            got = _acceptance(Path(work) / "a.gguf", trained, held, target_rows)
        print(json.dumps({"setting": name, "train": train_set, "lr": float(lr),
                          "epochs": int(epochs), "labels": labels, "optimizer": opt,
                          "eps": float(eps), "train_s": round(seconds),
                          "loss": run.losses_line(losses, int(epochs)),
                          **{k: round(got[k] - base[k], 3) for k in got}}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Training the draft on the teacher data, planned first: the memory plan (the trained tensors
in F32 with their gradients and AdamW's two moments, the rest as stored, the F32 KV cache and the
activations of one window) refuses a run that does not fit with one line saying what would, and
the run reports each step with an ETA.

Which tensors train: measured (Qwen2.5-Coder-0.5B, 256-token steps, AMD EPYC Zen 4, 2 cores,
llama-cpp-python 0.3.36), every tensor took 52 s a step (10 GB), the last 4 blocks and the head
21 s, the head alone 13-19 s: with a 151,936-token vocabulary the head is most of the step. The
project's sweeps (docs/results/latest/adapt-sweep/) found the head at lr 1e-4 the worst setting
(it fits the trained requests and loses on others of their kind) and the last blocks without the
head at lr 3e-5 the one that did not hurt; that is the default ("last4"), the head an option.

The context is a multiple of 256: llama.cpp pads a context to 256 tokens and its trainer then
reads a window of the padded size from the dataset (a shorter one fails an assertion inside
`opt_epoch`, which ends the process), so `check_context` refuses any other size in one line.

The trainer reads a copy with the trained tensors as F32, and the adapted draft is written as a
derived file only when the whole run succeeded (loading/derived/adapted.py): Ctrl-C or a failure
leaves the draft and any earlier adapted draft as they were.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from bench.adapt.data import Window
from engine.errors import SettingsError
from loading.derived.trainable import TRAIN_SETS, trains, write_adapted, write_trainable
from models.found import size_text
from models.gguf_info import GGUFInfo

DEFAULT_TRAIN = "last4"
DEFAULT_CONTEXT = 256
DEFAULT_EPOCHS = 2
DEFAULT_LR = 3e-5
# llama.cpp's context padding (llama_context: n_ctx rounded up to a multiple of 256).
CONTEXT_STEP = 256
GIB = 1024 ** 3
# The train sets `--train` offers (loading/derived/trainable.py).
CHOICES = TRAIN_SETS


@dataclass(frozen=True)
class MemoryPlan:
    trained_bytes: int   # the trained tensors in F32, with gradients and both AdamW moments
    frozen_bytes: int    # every other tensor as stored
    kv_bytes: int
    activation_bytes: int

    @property
    def total(self) -> int:
        return self.trained_bytes + self.frozen_bytes + self.kv_bytes + self.activation_bytes


def _elements(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


def plan(draft: GGUFInfo, train_set: str, n_ctx: int) -> MemoryPlan:
    chosen = trains(train_set, draft.n_layer)
    trained = sum(4 * 4 * _elements(t.shape) for t in draft.tensors if chosen(t.name))
    frozen = sum(t.n_bytes for t in draft.tensors if not chosen(t.name))
    kv_dim = draft.n_head_kv * (draft.head_dim_k + draft.head_dim_v)
    kv = 4 * draft.n_layer * n_ctx * kv_dim
    n_ff = max((int(t.shape[1]) for t in draft.tensors if t.name.endswith("ffn_up.weight")),
               default=4 * draft.n_embd)
    # Per window: each block's F32 activations and their gradients (attention scores included),
    # and the logits with their softmax and gradient.
    per_layer = 2 * 4 * n_ctx * (12 * draft.n_embd + 3 * n_ff + draft.n_head * n_ctx)
    activations = draft.n_layer * per_layer + 3 * 4 * n_ctx * draft.n_vocab
    return MemoryPlan(trained, frozen, kv, activations)


def check_context(n_ctx: int) -> int:
    """`n_ctx`, or a SettingsError unless it is a positive multiple of CONTEXT_STEP."""
    if n_ctx <= 0 or n_ctx % CONTEXT_STEP:
        raise SettingsError(f"--context {n_ctx}: the training window must be a multiple of "
                            f"{CONTEXT_STEP} tokens (llama.cpp pads its context to that)")
    return n_ctx


def check_fits(draft: GGUFInfo, train_set: str, n_ctx: int, available: int) -> MemoryPlan:
    """The plan, or a SettingsError naming what would fit: a smaller train set, or a shorter
    window that is still a multiple of CONTEXT_STEP."""
    check_context(n_ctx)
    need = plan(draft, train_set, n_ctx)
    if need.total <= available:
        return need
    options = [f"--train {t}" for t in sorted(CHOICES, key=lambda t: plan(draft, t, n_ctx).total)
               if t != train_set and plan(draft, t, n_ctx).total <= available][:1]
    options += [f"--context {c}" for c in range(n_ctx - CONTEXT_STEP, 0, -CONTEXT_STEP)
                if plan(draft, train_set, c).total <= available][:1]
    fix = ("; " + " or ".join(options) + " would fit") if options else \
        "; no setting fits: close other programs"
    raise SettingsError(f"adapting {draft.path.name} needs {size_text(need.total)} (trained "
                        f"tensors {size_text(need.trained_bytes)}, activations "
                        f"{size_text(need.activation_bytes)}) and {size_text(available)} is "
                        f"free{fix}")


def available_memory() -> int:
    """MemAvailable (Linux), else the total less nothing: the plan's budget."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class Step:
    """What a progress line shows after one step (`accuracy`: the trainer's own, over the
    window's positions, `ggml_opt_result_accuracy`)."""
    done: int
    total: int
    loss: float
    elapsed_s: float
    accuracy: float = float("nan")

    @property
    def eta_s(self) -> float:
        return self.elapsed_s / self.done * (self.total - self.done)


# Trainer(path, n_ctx, trains, lr) -> an object with step(window, labels) -> (loss, accuracy),
# save(path), close().
MakeTrainer = Callable[[Path, int, Callable[[str], bool], float], object]


def train_draft(draft: GGUFInfo, windows: Sequence[Window], out: Path, work: Path,
                train_set: str, epochs: int, lr: float, make: MakeTrainer,
                progress: Callable[[Step], None], clock: Callable[[], float] = time.monotonic
                ) -> list[Step]:
    """Train `draft` on `windows` (labelled for a trainer without a loss mask: data.py
    `with_own_labels`) for `epochs` and write the adapted draft to `out`, using the folder
    `work` for the trainer's copies; every step."""
    if not windows:
        raise SettingsError("the teacher data fills no training window: give more prompts")
    n_ctx = check_context(len(windows[0].tokens))
    chosen = trains(train_set, draft.n_layer)
    trainable, trained = work / "trainable.gguf", work / "trained.gguf"
    names = write_trainable(draft.path, trainable, chosen)
    trainer = make(trainable, n_ctx, chosen, lr)
    steps: list[Step] = []
    try:
        total, start = epochs * len(windows), clock()
        for _ in range(epochs):
            for w in windows:
                loss, acc = trainer.step(w.tokens, w.labels)  # type: ignore[attr-defined]
                steps.append(Step(len(steps) + 1, total, loss, clock() - start, acc))
                progress(steps[-1])
        trainer.save(trained)  # type: ignore[attr-defined]
    finally:
        trainer.close()  # type: ignore[attr-defined]
    write_adapted(draft.path, trained, out, names)
    return steps

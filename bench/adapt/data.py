"""The teacher data for adapting a draft: deployment-like prompts answered by the target, greedy
and sampled (T 0.7), so that the target's own distribution is what the draft learns
(sequence-level distillation: DistillSpec, arXiv 2310.08461).

What the draft is trained on matches what it is asked while decoding (issue 63): each example is
its own window (its prompt's tail and its whole answer: no request attends to another, no label
lacks its request), only the answer positions carry labels, and each label is the target's argmax
there (what greedy verification accepts; along a sampled answer too, never the sampled token).
The prompt is context only, and each trained prompt is answered once (greedy or T 0.7, in turn),
so no prompt is trained twice.

Prompts come from the user's history (loading/history.py: each past request's tokens up to the
chat template's assistant header) or a prompts file. The answers are kept in the store as
`derived/adapt-data-<hash>.npz`, written user-only (0600) through the one atomic write, so a
second run with the same prompts and target reuses them; they never leave the machine.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from engine.backend import Backend
from models.atomic import write_atomically

TEACHER_TEMPERATURE = 0.7
ANSWER_TOKENS = 64


@dataclass(frozen=True)
class Example:
    """One prompt's tokens (through the chat template), one answer of the target's, and the
    target's argmax before each answer token (along the answer as it was said)."""
    category: str
    prompt: tuple[int, ...]
    answer: tuple[int, ...]
    temperature: float
    # The target's argmax at each answer position (empty: the answer is greedy, its own argmax).
    argmax: tuple[int, ...] = ()

    @property
    def tokens(self) -> list[int]:
        return [*self.prompt, *self.answer]

    @property
    def labels(self) -> list[int]:
        """What the draft learns at each answer position (the prompt's last token and each
        answer token but the last): the target's argmax there.

        >>> Example("c", (1, 2, 3), (4, 5), 0.7, argmax=(4, 6)).labels
        [4, 6]
        """
        return list(self.argmax) if self.argmax else list(self.answer)


def _softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    z = logits.astype(np.float64) / temperature
    z -= z.max()
    p = np.exp(z)
    return p / p.sum()


def answer(target: Backend, prompt: Sequence[int], max_tokens: int, temperature: float,
           rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """The target's answer to `prompt` (greedy at temperature 0, else sampled), and its argmax
    at each answer position (the label: the same tokens when greedy)."""
    target.truncate(0)
    logits = target.decode(list(prompt), 0, [len(prompt) - 1])[-1]
    out: list[int] = []
    best: list[int] = []
    for _ in range(max_tokens):
        best.append(int(np.argmax(logits)))
        tok = best[-1] if temperature == 0 else int(
            rng.choice(len(logits), p=_softmax(logits, temperature)))
        out.append(tok)
        if target.is_eog(tok):
            break
        logits = target.decode([tok], len(prompt) + len(out) - 1, [0])[-1]
    return out, best


def _teach(target: Backend, asked: Sequence[tuple[str, list[int], float]], max_tokens: int,
           seed: int, progress: Callable[[int, int], None]) -> list[Example]:
    rng = np.random.default_rng(seed)
    out: list[Example] = []
    for cat, toks, temp in asked:
        said, best = answer(target, toks, max_tokens, temp, rng)
        out.append(Example(cat, tuple(toks), tuple(said), temp,
                           tuple(best) if temp != 0 else ()))
        progress(len(out), len(asked))
    return out


def teach(target: Backend, prompts: Sequence[tuple[str, list[int]]], max_tokens: int,
          seed: int, progress: Callable[[int, int], None] = lambda i, n: None,
          temperatures: Sequence[float] = (0.0, TEACHER_TEMPERATURE)) -> list[Example]:
    """Each prompt answered by the target at each of `temperatures`: by default twice, greedy
    and sampled at T 0.7 (the held-out prompts, measured at both)."""
    return _teach(target, [(c, t, temp) for c, t in prompts for temp in temperatures],
                  max_tokens, seed, progress)


def teach_once(target: Backend, prompts: Sequence[tuple[str, list[int]]], max_tokens: int,
               seed: int, progress: Callable[[int, int], None] = lambda i, n: None,
               temperatures: Sequence[float] = (0.0, TEACHER_TEMPERATURE)) -> list[Example]:
    """Each prompt answered once, at `temperatures` in turn (the trained prompts: none twice)."""
    return _teach(target, [(c, t, temperatures[i % len(temperatures)])
                           for i, (c, t) in enumerate(prompts)], max_tokens, seed, progress)


def data_sha256(examples: Sequence[Example]) -> str:
    """A hash of the teacher data (every example's tokens, category and temperature)."""
    h = hashlib.sha256()
    for e in examples:
        h.update(f"{e.category}|{e.temperature}|{len(e.prompt)}|".encode())
        h.update(np.asarray(e.tokens, dtype=np.int32).tobytes())
    return h.hexdigest()


def prompts_sha256(prompts: Sequence[tuple[str, list[int]]], target_sha: str, seed: int,
                   max_tokens: int, how: str = "both") -> str:
    """What the teacher data is a function of: the prompts, the target, the seed, the length,
    `how` they were asked ("both" temperatures or "once") and the data's format (3: the target's
    argmax along each answer)."""
    h = hashlib.sha256(f"3|{how}|{target_sha}|{seed}|{max_tokens}|".encode())
    for cat, toks in prompts:
        h.update(cat.encode() + b"|" + np.asarray(toks, dtype=np.int32).tobytes())
    return h.hexdigest()


def save_arrays(path: Path, **arrays: Any) -> Path:
    """Write arrays drawn from the teacher data as one .npz, user-only (0600), atomically."""
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
    return write_atomically(path, write, private=True)


def save(path: Path, examples: Sequence[Example]) -> Path:
    """Write the teacher data user-only (0600), atomically."""
    return save_arrays(
        path, categories=np.array([e.category for e in examples]),
        temperatures=np.array([e.temperature for e in examples]),
        prompt_lens=np.array([len(e.prompt) for e in examples]),
        lens=np.array([len(e.tokens) for e in examples]),
        tokens=np.concatenate([np.asarray(e.tokens, np.int32) for e in examples]),
        argmax=np.concatenate([np.asarray(e.argmax, np.int32) for e in examples]),
        argmax_lens=np.array([len(e.argmax) for e in examples]))


def load(path: Path) -> list[Example]:
    with np.load(path, allow_pickle=False) as f:
        tokens, lens, plens = f["tokens"], f["lens"], f["prompt_lens"]
        cats, temps = f["categories"], f["temperatures"]
        best, blens = f["argmax"], f["argmax_lens"]
    out, at, best_at = [], 0, 0
    for cat, temp, n, p, b in zip(cats, temps, lens, plens, blens):
        seq = [int(t) for t in tokens[at:at + n]]
        chosen = tuple(int(t) for t in best[best_at:best_at + b])
        out.append(Example(str(cat), tuple(seq[:p]), tuple(seq[p:]), float(temp), chosen))
        at += int(n)
        best_at += int(b)
    return out


@dataclass(frozen=True)
class Window:
    """One training window of n_ctx tokens: what each position is trained to predict, and
    whether that label counts (`scored`: the answer positions; the rest is context or padding,
    which a trainer with a loss mask leaves out, `with_own_labels` for one without)."""
    tokens: list[int]
    labels: list[int]
    scored: list[bool]


def windows(examples: Sequence[Example], n_ctx: int, pad: int) -> list[Window]:
    """One window per example: its prompt's last tokens and its answer (cut to n_ctx - 1),
    padded with `pad` to n_ctx; labels at the answer positions, the target's argmax there; the
    other positions' labels are the next token, unscored."""
    out = []
    for e in examples:
        said, best = list(e.answer[:n_ctx - 1]), e.labels[:n_ctx - 1]
        head = list(e.prompt[-(n_ctx - len(said)):])
        toks = head + said
        labels = toks[1:] + [pad]
        scored = [False] * len(toks)
        for j, lab in enumerate(best):
            labels[len(head) - 1 + j] = lab
            scored[len(head) - 1 + j] = True
        fill = n_ctx - len(toks)
        out.append(Window(toks + [pad] * fill, labels + [pad] * fill, scored + [False] * fill))
    return out


def with_own_labels(wins: Sequence[Window], own: Callable[[list[int]], Sequence[int]]
                    ) -> list[Window]:
    """`wins` for a trainer whose labels are one-hot token ids without a mask (llama.cpp's
    `opt_epoch_iter` sets one 1.0 per position, every position counted): each unscored position
    labelled with `own(tokens)`'s token there, the draft's own argmax before training, the
    nearest such a label comes to none (its gradient only sharpens what the draft already
    predicts, toward no text of the user's or the target's)."""
    out = []
    for w in wins:
        mine = own(w.tokens)
        out.append(Window(w.tokens, [lab if s else int(m) for lab, s, m in
                                     zip(w.labels, w.scored, mine)], w.scored))
    return out


def history_prompts(documents: Sequence[Sequence[int]], header: Sequence[int]) -> list[list[int]]:
    """The requests in the history's documents (prompt and answer end to end): each document up
    to and with the last occurrence of the chat template's assistant `header`."""
    out = []
    k = len(header)
    for doc in documents:
        doc = list(doc)
        at = next((i for i in range(len(doc) - k, -1, -1) if doc[i:i + k] == list(header)), -1)
        if at > 0:
            out.append(doc[:at + k])
    return out


def cached(key: str, folder: Path, make: Callable[[], list[Example]]) -> list[Example]:
    """The teacher data of `key` (prompts_sha256) from `folder`, made and saved the first time."""
    path = folder / f"adapt-data-{key[:16]}.npz"
    if path.is_file():
        return load(path)
    examples = make()
    save(path, examples)
    return examples

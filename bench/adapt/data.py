"""The teacher data for adapting a draft: deployment-like prompts answered by the target, greedy
and sampled (T 0.7), so that the target's own distribution is what the draft learns
(sequence-level distillation: DistillSpec, arXiv 2310.08461).

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
    target's own choice (its argmax) after each prompt token but the last: what the draft learns
    there instead of the user's text, which no draft is ever asked to guess."""
    category: str
    prompt: tuple[int, ...]
    answer: tuple[int, ...]
    temperature: float
    # The target's argmax at prompt rows 0 .. len(prompt) - 2 (empty: label by the text).
    choices: tuple[int, ...] = ()

    @property
    def tokens(self) -> list[int]:
        return [*self.prompt, *self.answer]

    @property
    def labels(self) -> list[int]:
        """What each of `tokens` but the last is trained to predict: the target's choice within
        the prompt, the answer's next token from the prompt's last token on.

        >>> Example("c", (1, 2, 3), (4, 5), 0.0, choices=(7, 8)).labels
        [7, 8, 4, 5]
        """
        inside = list(self.choices) if self.choices else list(self.prompt[1:])
        return [*inside, *self.answer]


def _softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    z = logits.astype(np.float64) / temperature
    z -= z.max()
    p = np.exp(z)
    return p / p.sum()


def answer(target: Backend, prompt: Sequence[int], max_tokens: int, temperature: float,
           rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """The target's answer to `prompt` (greedy at temperature 0, else sampled), and its argmax
    at every prompt row but the last (`Example.choices`)."""
    target.truncate(0)
    rows = target.decode(list(prompt), 0, list(range(len(prompt))))
    choices = [int(t) for t in np.argmax(rows[:-1], axis=1)] if len(prompt) > 1 else []
    logits = rows[-1]
    out: list[int] = []
    for _ in range(max_tokens):
        tok = int(np.argmax(logits)) if temperature == 0 else int(
            rng.choice(len(logits), p=_softmax(logits, temperature)))
        out.append(tok)
        if target.is_eog(tok):
            break
        logits = target.decode([tok], len(prompt) + len(out) - 1, [0])[-1]
    return choices, out


def teach(target: Backend, prompts: Sequence[tuple[str, list[int]]], max_tokens: int,
          seed: int, progress: Callable[[int, int], None] = lambda i, n: None,
          temperatures: Sequence[float] = (0.0, TEACHER_TEMPERATURE)) -> list[Example]:
    """Each prompt answered by the target at each of `temperatures`: by default twice, greedy
    and sampled at T 0.7."""
    rng = np.random.default_rng(seed)
    out: list[Example] = []
    n = len(temperatures) * len(prompts)
    for cat, toks in prompts:
        for temp in temperatures:
            choices, said = answer(target, toks, max_tokens, temp, rng)
            out.append(Example(cat, tuple(toks), tuple(said), temp, tuple(choices)))
            progress(len(out), n)
    return out


def data_sha256(examples: Sequence[Example]) -> str:
    """A hash of the teacher data (every example's tokens, category and temperature)."""
    h = hashlib.sha256()
    for e in examples:
        h.update(f"{e.category}|{e.temperature}|{len(e.prompt)}|".encode())
        h.update(np.asarray(e.tokens, dtype=np.int32).tobytes())
    return h.hexdigest()


def prompts_sha256(prompts: Sequence[tuple[str, list[int]]], target_sha: str, seed: int,
                   max_tokens: int) -> str:
    """What the teacher data is a function of: the prompts, the target, the seed, the length
    (and the data's format: 2 added the target's choices within the prompt)."""
    h = hashlib.sha256(f"2|{target_sha}|{seed}|{max_tokens}|".encode())
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
        choices=np.concatenate([np.asarray(e.choices, np.int32) for e in examples]),
        choice_lens=np.array([len(e.choices) for e in examples]))


def load(path: Path) -> list[Example]:
    with np.load(path, allow_pickle=False) as f:
        tokens, lens, plens = f["tokens"], f["lens"], f["prompt_lens"]
        cats, temps = f["categories"], f["temperatures"]
        # Format 1 (before the prompt's choices): every example labelled by its text.
        choices = f["choices"] if "choices" in f.files else np.zeros(0, np.int32)
        clens = f["choice_lens"] if "choice_lens" in f.files else np.zeros(len(lens), int)
    out, at, cat_at = [], 0, 0
    for cat, temp, n, p, c in zip(cats, temps, lens, plens, clens):
        seq = [int(t) for t in tokens[at:at + n]]
        chosen = tuple(int(t) for t in choices[cat_at:cat_at + c])
        out.append(Example(str(cat), tuple(seq[:p]), tuple(seq[p:]), float(temp), chosen))
        at += int(n)
        cat_at += int(c)
    return out


Window = tuple[list[int], list[int]]


def windows(examples: Sequence[Example], n_ctx: int) -> list[Window]:
    """The examples end to end, cut into windows of n_ctx tokens with their labels (each
    example's `labels`; its last token's is the next example's first token), as llama.cpp's
    finetune packs its text; the tail that fills no window is dropped.

    >>> a, b = Example("c", (1, 2), (3,), 0.0, (9,)), Example("c", (4, 5), (6,), 0.0, (8,))
    >>> windows([a, b], 2)
    [([1, 2], [9, 3]), ([3, 4], [4, 8])]
    """
    stream = [t for e in examples for t in e.tokens]
    labels: list[int] = []
    for e, nxt in zip(examples, [*examples[1:], None]):
        labels += e.labels + ([nxt.tokens[0]] if nxt is not None else [])
    return [(stream[i:i + n_ctx], labels[i:i + n_ctx])
            for i in range(0, len(labels) - n_ctx + 1, n_ctx)]


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

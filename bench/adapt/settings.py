"""What `tandem adapt` takes beyond the pair, with its defaults: the options of the same names on
the command line and the Models tab's fields (bench/adapt/train.py says why these defaults).
A window that is not a multiple of 256 tokens is refused here, in one line, before anything
loads."""
from __future__ import annotations

from dataclasses import dataclass

from bench.adapt.data import ANSWER_TOKENS
from bench.adapt.train import (DEFAULT_CONTEXT, DEFAULT_EPOCHS, DEFAULT_LR, DEFAULT_TRAIN,
                               check_context)
from bench.benchmark.suite import DEFAULT_SUITE


@dataclass(frozen=True)
class Settings:
    train: str = DEFAULT_TRAIN
    epochs: int = DEFAULT_EPOCHS
    context: int = DEFAULT_CONTEXT
    lr: float = DEFAULT_LR
    max_tokens: int = ANSWER_TOKENS
    holdout: str = str(DEFAULT_SUITE)
    holdout_per_category: int = 2
    # Above this greedy acceptance per position of the base draft on your requests, the run
    # declines before training (the app's default, app/runtime/defaults.py; None: never, as
    # `--force` asks).
    decline_above: float | None = None

    def __post_init__(self) -> None:
        check_context(self.context)

"""What the adaptive controller learns about a drafter of a pair, kept across its answers:
acceptance per acceptance key (`RoundPlan.acceptance_key`: the draft model; each copy source by
match length), the draft's cost and the verify curve as rounds measured them (a cost model made
from the drafter's calibration on first use), and the exploration ledger (the plain-token time
seen and what probes lost).

It belongs to the pair, not to one generation: the pair keeps each drafter's evidence beside its
calibration (engine/knowledge.py) and hands both to every controller it makes, which starts from
the evidence and adds to it (`begin_answer`). `as_dict`/`restore` carry it to disk, where the
loading layer keys it by the pair, the machine and the build (loading/evidence.py); the keeper
given at construction hears it after every answer that used it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from engine.control.constants import ControllerConstants
from engine.control.costs import Calibration, CostModel
from engine.control.estimator import AcceptanceEstimator

# The on-disk form's version: a file of another is not read.
FORMAT = 1


@dataclass
class Evidence:
    estimator: AcceptanceEstimator | None = None
    costs: CostModel | None = None
    # The time plain decoding would have taken for every token committed under this evidence
    # (ms), and what exploring rounds lost against it: the exploration budget's ledger.
    plain_ms: float = 0.0
    explored_ms: float = 0.0
    # Answers that used it.
    answers: int = 0
    # A restored form waiting for the first controller's constants.
    pending: dict = field(default_factory=dict)
    # Hears the evidence after every answer that used it (the loading layer's file keeper):
    # given at construction, by whoever restores it.
    keeper: Callable[["Evidence"], None] | None = field(default=None, repr=False, compare=False)

    def begin_answer(self, calibration: Calibration,
                     constants: ControllerConstants) -> AcceptanceEstimator:
        """A controller with `constants` starts an answer from this evidence: the cost model is
        made from `calibration` on first use (later calibrations of the drafter leave the one
        learned since), and the estimator with `constants` (`adopt`)."""
        if self.costs is None:
            self.costs = CostModel(calibration, constants.rate)
        self.costs.rate = constants.rate
        self.answers += 1
        return self.adopt(constants)

    def answered(self) -> None:
        """An answer that used this evidence ended: its keeper, if any, keeps it."""
        if self.keeper is not None:
            self.keeper(self)

    def adopt(self, constants: ControllerConstants) -> AcceptanceEstimator:
        """The estimator, made (or restored) on first use with `constants`."""
        if self.estimator is None:
            self.estimator = AcceptanceEstimator(constants)
            if self.pending:
                try:
                    self.estimator.restore(self.pending)
                except (KeyError, TypeError, ValueError):
                    self.estimator = AcceptanceEstimator(constants)
                self.pending = {}
        self.estimator.constants = constants
        return self.estimator

    def as_dict(self) -> dict:
        est = self.estimator.as_dict() if self.estimator is not None else self.pending
        return {"format": FORMAT, "acceptance": est, "plain_ms": self.plain_ms,
                "explored_ms": self.explored_ms, "answers": self.answers,
                "verify_ms": list(self.costs.verify) if self.costs is not None else [],
                "draft_token_ms": self.costs.draft_token if self.costs is not None else None}

    @classmethod
    def restore(cls, d: dict, keeper: Callable[["Evidence"], None] | None = None) -> "Evidence":
        """Evidence from `as_dict`'s form, kept by `keeper`; raises ValueError on another format.
        The measured costs are not restored: the calibration at load is the machine's pace now."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError("evidence of another format")
        acceptance = d.get("acceptance") or {}
        if not isinstance(acceptance, dict):
            raise ValueError("malformed acceptance counts")
        return cls(plain_ms=float(d["plain_ms"]), explored_ms=float(d["explored_ms"]),
                   answers=int(d["answers"]), pending=acceptance, keeper=keeper)

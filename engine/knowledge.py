"""What a pair knows of each drafter: its calibration, the costs measured for it
(engine/control/costs.py), made on first use and remeasured only for a wider gamma; and its
evidence, what the adaptive controllers learned of it over the pair's answers
(engine/control/evidence.py). `Knowledge` is their one owner: it hands both to every policy the
pair makes (`GammaPolicy.use_calibration`), and restores both from where they are kept when the
loading layer gives it a source: the evidence (`restore_evidence_from`, loading/evidence.py) and
the calibrations (`keep_calibrations_in`, loading/calibrations.py), so a new process starts from
the costs an earlier one measured on this machine and its first answer pays no calibration. A
calibration taken while the machine was busy (`Calibration.busy`) serves this process and is
not kept: a later process measures again.

A calibration decodes a short fixed text after what the caches hold and leaves them as they
were; a cache too full for it starts over (the next generation re-decodes its prompt).
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

from engine.clock import Clock
from engine.control.costs import Calibration, calibrate
from engine.control.evidence import Evidence
from engine.drafters.base import Drafter
from engine.machine_load import Load, no_load
from engine.session import Session

# Calibrations measure at least widths 1..9: enough to see which batch widths are worth padding to.
PAD_CALIBRATION_GAMMA = 8

# Calibration decodes this text when a cache is still empty.
CALIBRATION_TEXT = "def add(a, b):\n    return a + b\n"


def calibration_plan(context: Sequence[int], widths: int, n_ctx: int) -> tuple[list[int], int]:
    """The calibration's context and widest batch for a context of `n_ctx`: all of both when
    they fit, else half the context (at least one token) and the widths the rest holds. The
    controller extrapolates costs past the widths measured (engine/control/controller.py)."""
    context = [int(t) for t in context]
    if len(context) + widths <= n_ctx:
        return context, widths
    context = context[:max(1, min(len(context), n_ctx // 2))]
    return context, max(1, min(widths, n_ctx - len(context)))


# A drafter's evidence by drafter name, restored from where it is kept (and kept there after
# every answer, by the keeper it is made with).
EvidenceSource = Callable[[str], Evidence]


def _fresh(name: str) -> Evidence:
    return Evidence()


class CalibrationStore(Protocol):
    """Where calibrations outlive the process, by drafter name and the drafter's model (the
    name of the backend it decodes with, "" for none)."""

    def restore(self, name: str, model: str, widths: int) -> Calibration | None:
        """The calibration kept for the drafter, when one covers `widths`; else None."""

    def keep(self, name: str, model: str, calibration: Calibration) -> None:
        """Keep a calibration just measured (a busy one is the store's to refuse)."""


class Unkept:
    """No store: every process measures its own."""

    def restore(self, name: str, model: str, widths: int) -> Calibration | None:
        return None

    def keep(self, name: str, model: str, calibration: Calibration) -> None:
        pass


class Knowledge:
    """Calibrations and evidence by drafter name; as a mapping, the calibrations."""

    def __init__(self, source: EvidenceSource = _fresh, load: Load = no_load) -> None:
        self._by_name: dict[str, Calibration] = {}
        self._evidence: dict[str, Evidence] = {}
        self._source = source
        self._store: CalibrationStore = Unkept()
        # How busy the machine is while a calibration times it (engine/machine_load.py).
        self._load = load

    def keep_calibrations_in(self, store: CalibrationStore) -> None:
        """Take each drafter's calibration from `store` when it holds one wide enough, and keep
        every one measured from now on there; calibrations already in use stay."""
        self._store = store

    def restore_evidence_from(self, source: EvidenceSource) -> None:
        """Take each drafter's evidence from `source` from now on (the loading layer's file of
        the pair); evidence already in use stays."""
        self._source = source

    def evidence_of(self, name: str) -> Evidence:
        """The evidence of drafter `name`: restored from the source on first use, then the same
        until the drafter is forgotten."""
        found = self._evidence.get(name)
        if found is None:
            found = self._evidence[name] = self._source(name)
        return found

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> Calibration:
        return self._by_name[name]

    def __setitem__(self, name: str, calibration: Calibration) -> None:
        self._by_name[name] = calibration

    def __iter__(self):
        return iter(self._by_name)

    def forget(self, name: str) -> None:
        """A drafter offered anew: its calibration and evidence start over."""
        self._by_name.pop(name, None)
        self._evidence.pop(name, None)

    def get(self, name: str, drafter: Drafter, target: Session, max_gamma: int, n_ctx: int,
            context: Callable[[], list[int]], clock: Clock) -> Calibration:
        """Measured costs for `drafter` (named `name`) up to `max_gamma`: the ones in use, else
        the store's, else measured now (and given to the store); `context()` gives the tokens of
        CALIBRATION_TEXT. The caller holds the pair's turn."""
        max_gamma = max(max_gamma, PAD_CALIBRATION_GAMMA)
        cached = self._by_name.get(name)
        if cached is not None and len(cached.verify_ms) >= max_gamma + 1:
            return cached
        session = drafter.session
        tokens, widths = calibration_plan(context(), max_gamma + 1, n_ctx)
        if cached is not None and len(cached.verify_ms) >= widths:
            return cached
        model = session.backend.name if session is not None else ""
        kept = self._store.restore(name, model, widths)
        if kept is not None:
            self._by_name[name] = kept
            return kept
        for s in (target, session):
            # Calibration decodes after what a cache holds; a cache too full for it starts
            # over (the next generation re-decodes its prompt, nothing else changes).
            if s is not None and s.n_past + widths + (0 if s.n_past else len(tokens)) > s.backend.n_ctx:
                s.rollback(0)
        result = calibrate(target, session, widths - 1, tokens, model_name=drafter.model_name,
                           clock=clock, load=self._load)
        self._by_name[name] = result
        self._store.keep(name, model, result)
        return result

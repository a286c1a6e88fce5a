"""Steps of several sequences decoded together: every model call of a step is one batch.

Each sequence runs its own generation (its rounds, its random stream, its grammar) in its own
thread, registered here while it runs (`enter`, `leave`). When a sequence decodes it parks its
part of the batch here and waits. Once every registered sequence is parked or gone, the last one
to park runs the step: each model decodes every part parked for it in one `decode_batch` (the
target: each sequence's last token, forced tokens and draft; the draft model: one batch per
depth for every sequence that drafts), then every waiting sequence takes its rows and runs on.
The target's parts wait out the steps in which a draft's are parked, so the sequences' verifies
fall into one call whatever their gammas (a step then costs one model's call, not both).

A sampled draft's length follows its own draws (its stops read them), and with the target's
parts waiting on the drafts, that length would decide which step the sequence's verify lands in,
who shares it and how wide it is; llama.cpp's rows move with a batch's width (docs/EXACTNESS.md).
So a round whose draft samples promises its draft's decodes before it draws (`draft_parts`): a
draft that stops sooner decodes a throwaway token at its sequence's next position in each step
it still owes (the same rows, so every draft call keeps its shape; the cache drops it after the
step), and its verify parks in the step a full draft's would have. Every step's parts and widths
are then fixed before the round's draws.
Sequences join and leave between steps (continuous batching), as llama-server's slots do.
After a step the sequences it served run on one at a time, in the order they parked (their
Python shares one interpreter lock anyway), so what they do between steps happens in the same
order every time.

No model is ever called by two threads at once: the step runs under the models' lock, and so
does everything else that touches a cache (`truncate`, and `exclusive`, which calibration
holds while it decodes alone). A sequence's text reads only its own rows, so it does not depend
on who else is in the batch, up to the arithmetic of a wider batch (docs/EXACTNESS.md).
"""
from __future__ import annotations

import threading
from collections import deque
from contextlib import contextmanager
from typing import Iterator

from engine.backend import F32, Backend, Part
from engine.control.batch import ALONE, Batch, Share, among


class _Parked:
    """One sequence's part of the next step, and what the step gave it back."""

    __slots__ = ("backend", "part", "rows", "error", "done")

    def __init__(self, backend: Backend, part: Part) -> None:
        self.backend = backend
        self.part = part
        self.rows: F32 | None = None
        self.error: BaseException | None = None
        self.done = False


def _decode(group: list[_Parked]) -> None:
    """One model's parts in one call. When it fails, each part is decoded alone from where it
    started, so only the sequence at fault gets the error (a batch-mate's bad part must not end
    another's answer)."""
    backend = group[0].backend
    try:
        rows = backend.decode_batch([p.part for p in group])
    except BaseException as exc:  # noqa: BLE001 - each sequence raises its own
        if len(group) == 1:
            group[0].error = exc
            return
        for p in group:
            backend.truncate(p.part.pos, p.part.seq)
            _decode([p])
        return
    for p, r in zip(group, rows):
        p.rows = r


# A sequence that has not reported a round yet is counted as a plain one.
_PLAIN = Share(rows=1, tokens=1.0)


class _Mine(threading.local):
    """Each thread's ticket of the last step that served it (None: none yet), and the draft
    decodes its round promised (`BatchStep.draft_parts`): how many are still owed, and where
    its sequence of the drafting model ends."""

    last: _Parked | None = None
    owed = 0
    drafting: Backend | None = None
    seq = 0
    end = 0
    token = 0


class BatchStep:
    def __init__(self, verifier: Backend | None = None) -> None:
        # The target: its parts wait while another model's are parked (`_run`).
        self.verifier = verifier
        self._cond = threading.Condition()
        # Registered sequences not parked: the step waits for each of them to park or leave.
        self._running = 0
        self._parked: list[_Parked] = []
        self._stepping = False
        # The sequences the last step served, in order: the first runs, the rest wait for it
        # to park again or leave. Each thread's ticket of its last step is `_mine.last`.
        self._turns: deque[_Parked] = deque()
        self._mine = _Mine()
        # Held for every call into a model: a step, a truncation, a calibration.
        self.models = threading.RLock()
        # Steps run (tests read them), and the sequences registered now: the batch's width in
        # sequences, which a policy pricing a round at the batch's width reads.
        self.steps = 0
        self.sequences = 0
        # What each registered sequence's last round put into a step, by its thread (`report`):
        # the batch the others' rounds are priced in (`batch`).
        self._shares: dict[int, Share] = {}

    @contextmanager
    def sequence(self) -> Iterator[None]:
        """Register the calling thread's sequence for the body."""
        with self._cond:
            self._running += 1
            self.sequences += 1
            self._mine.last = None
            self._mine.owed = 0
        try:
            yield
        finally:
            self._leave()

    def _leave(self) -> None:
        with self._cond:
            self._running -= 1
            self.sequences -= 1
            self._shares.pop(threading.get_ident(), None)
            self._pass_turn()
            parked = self._take()
        if parked:
            self._run(parked)

    def draft_parts(self, n: int) -> None:
        """The calling sequence's round drafts through `n` decodes of its drafting model,
        whatever it draws: the draft's first call is the model's, and the first call on another
        model (the verify) parks only after `n` of them, idling through the ones the draft
        stopped before."""
        self._mine.owed = n
        self._mine.drafting = None

    def decode(self, backend: Backend, part: Part) -> F32:
        """`part`'s rows, decoded in the next step with every other sequence's parts."""
        mine = self._mine
        if mine.owed > 0:
            if mine.drafting is None or mine.drafting is backend:
                mine.drafting, mine.seq = backend, part.seq
                mine.end, mine.token = part.pos + len(part.tokens), int(part.tokens[-1])
                mine.owed -= 1
            else:
                self._idle()
        return self._step(backend, part)

    def _idle(self) -> None:
        """The draft decodes the calling sequence still owes: each a throwaway token at its
        sequence's next position, with one row, as a draft of one more token, dropped again."""
        mine = self._mine
        backend, owed = mine.drafting, mine.owed
        mine.owed = 0
        assert backend is not None
        for _ in range(owed):
            if mine.end >= backend.n_ctx:
                return
            self._step(backend, Part(mine.seq, [mine.token], mine.end, [0]))
            self.truncate(backend, mine.end, mine.seq)

    def _step(self, backend: Backend, part: Part) -> F32:
        mine = _Parked(backend, part)
        with self._cond:
            self._parked.append(mine)
            self._running -= 1
            self._pass_turn()
            parked = self._take()
        if parked:
            self._run(parked)
        with self._cond:
            self._cond.wait_for(lambda: mine.done and self._turns[0] is mine)
        self._mine.last = mine
        if mine.error is not None:
            raise mine.error
        assert mine.rows is not None
        return mine.rows

    def _pass_turn(self) -> None:
        """The calling thread, if its turn is running, hands it to the next in line."""
        if self._turns and self._turns[0] is self._mine.last:
            self._turns.popleft()
            self._cond.notify_all()

    def _take(self) -> list[_Parked]:
        """The parts of a step to run now (held under the condition): all of them when every
        sequence is parked and no step is running, else none."""
        if self._running > 0 or self._stepping or not self._parked:
            return []
        parked, self._parked = self._parked, []
        self._stepping = True
        return parked

    def _run(self, parked: list[_Parked]) -> None:
        """Run steps until none is due; the caller took `parked` as the first."""
        while parked:
            by_model: dict[int, list[_Parked]] = {}
            for p in parked:
                by_model.setdefault(id(p.backend), []).append(p)
            # The target's parts wait while a draft's are parked: the sequences still drafting
            # catch up, and every verify of the step is one call (else rounds of different
            # phases keep apart, each verifying alone while the others draft, for good).
            wait = by_model.pop(id(self.verifier), []) if len(by_model) > 1 else []
            if wait:
                parked = [p for p in parked if p not in wait]
            with self.models:
                for group in by_model.values():
                    _decode(group)
            with self._cond:
                self.steps += 1
                for p in parked:
                    p.done = True
                self._turns.extend(parked)
                self._running += len(parked)
                self._stepping = False
                self._parked = wait + self._parked
                self._cond.notify_all()
                parked = self._take()

    def report(self, share: Share) -> None:
        """The calling sequence's last round put `share` into its step."""
        with self._cond:
            self._shares[threading.get_ident()] = share

    def batch(self) -> Batch:
        """What the other registered sequences put into a step, by their last rounds (one that
        has run none yet: a plain round's one row and one token); `ALONE` when none runs."""
        if self.sequences <= 1:
            return ALONE
        me = threading.get_ident()
        with self._cond:
            others = [s for t, s in self._shares.items() if t != me]
            missing = self.sequences - 1 - len(others)
        return among(others + [_PLAIN] * max(missing, 0))

    def truncate(self, backend: Backend, n: int, seq: int) -> None:
        mine = self._mine
        if mine.owed and mine.drafting is backend and mine.seq == seq:
            # A padded catch-up drops its padding: the sequence ends where it was cut.
            mine.end = min(mine.end, n)
        with self.models:
            backend.truncate(n, seq)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """The models alone for the body (no step runs meanwhile): a calibration times its
        decodes on them."""
        with self.models:
            yield

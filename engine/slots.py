"""A pair's slots: up to n generations decoded together, each on its own sequence of the
target's and the draft's caches (llama-server's slots, `--parallel`).

A slot is a sequence id of each model (1..n; sequence 0 stays the pair's own, which calibration
decodes on), a `Session` over it (engine/seq_backend.py) and drafters of its own over the
draft's sequence, so each generation has its own positions, draft cache, random stream, grammar
walk, stops and policy: nothing of one generation is read by another. Each generation runs in a
thread of its own, registered with the pair's `BatchStep` (engine/batch_step.py), whose steps
decode all of them in one batch per model; its events reach the caller through a queue, so a
slow reader never holds the batch up. Generations join and leave between steps.

A stream that is closed before its end (a client gone) stops its generation at the next event
and frees its slot's positions at once; one that ends keeps them, and the next prompt goes to
the free slot whose cache shares the longest prefix with it (llama-server's slot choice).
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Callable, Generator, Iterator, Sequence

from engine.backend import Backend
from engine.batch_step import BatchStep
from engine.drafter_registry import DrafterRegistry
from engine.drafters.base import Drafter
from engine.events import Event
from engine.seq_backend import SeqBackend
from engine.session import Session


@dataclass
class Slot:
    """One sequence of each model, with the session and drafters that own it."""

    index: int
    target: Session
    registry: DrafterRegistry


# What a generation on a slot is: its events, made from the slot it was given.
Run = Callable[[Slot], Generator[Event, None, None]]

_END = object()


def sequences_for(parallel: int) -> int:
    """The sequences a model's cache holds for `parallel` slots: one each and the pair's own,
    or one alone when generations run one at a time."""
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    return 1 if parallel == 1 else parallel + 1


class Slots:
    def __init__(self, target: Backend, draft: Backend | None, n: int,
                 registry: Callable[[Backend | None], DrafterRegistry]) -> None:
        if n < 1:
            raise ValueError(f"a pair needs at least one slot, got {n}")
        for backend in (target, draft):
            if backend is not None and backend.n_seq < n + 1:
                raise ValueError(f"{backend.name} holds {backend.n_seq} sequences; {n} slots "
                                 f"need {n + 1} (sequence 0 is the pair's own)")
        self.step = BatchStep(verifier=target)
        self._slots = [Slot(k, Session(SeqBackend(target, k + 1, self.step)),
                            registry(None if draft is None else SeqBackend(draft, k + 1, self.step)))
                       for k in range(n)]
        self._free = list(self._slots)
        self._cond = threading.Condition()

    def add_drafter(self, name: str, backend: Backend, make: Callable[[Backend], Drafter]) -> None:
        """Give every slot drafter `name`, made by `make` over the slot's sequence of
        `backend` (a model only that drafter uses; its owner closes it)."""
        for slot in self._slots:
            slot.registry.add(name, make(SeqBackend(backend, slot.index + 1, self.step)))

    def remove_drafter(self, name: str) -> None:
        for slot in self._slots:
            slot.registry.remove(name)

    @property
    def n(self) -> int:
        return len(self._slots)

    @property
    def busy(self) -> int:
        """Slots running a generation now (the batch's sequences)."""
        with self._cond:
            return len(self._slots) - len(self._free)

    def _acquire(self, prompt: Sequence[int]) -> Slot:
        """The free slot whose cache shares the longest prefix with `prompt` (waiting for one
        while a stream that was closed finishes its step)."""
        with self._cond:
            self._cond.wait_for(lambda: bool(self._free))
            best = max(self._free, key=lambda s: s.target.common_prefix(prompt))
            self._free.remove(best)
            return best

    def _release(self, slot: Slot, forget: bool) -> None:
        if forget:
            slot.target.rollback(0)
            slot.registry.reset()
        with self._cond:
            self._free.append(slot)
            self._cond.notify_all()

    def stream(self, prompt: Sequence[int], run: Run) -> Iterator[Event]:
        """`run`'s events on a free slot, produced in a thread of its own as fast as the batch
        goes; closing the iterator before its end stops the generation and frees the slot."""
        out: queue.SimpleQueue = queue.SimpleQueue()
        stop = threading.Event()
        threading.Thread(target=self._produce, args=(prompt, run, out, stop), daemon=True,
                         name="tandem-slot").start()
        try:
            while True:
                item = out.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()

    def _produce(self, prompt: Sequence[int], run: Run, out: queue.SimpleQueue,
                 stop: threading.Event) -> None:
        slot = self._acquire(prompt)
        finished = False
        try:
            with self.step.sequence():
                events = run(slot)
                try:
                    for event in events:
                        out.put(event)
                        if stop.is_set():
                            break
                    else:
                        finished = True
                finally:
                    events.close()
        except BaseException as exc:  # noqa: BLE001 - the reader raises it
            out.put(exc)
        finally:
            self._release(slot, forget=not finished)
            out.put(_END)

    def close(self) -> None:
        """Wait for every generation to leave its slot (a closed stream finishes its step),
        so the models can be freed."""
        with self._cond:
            self._cond.wait_for(lambda: len(self._free) == len(self._slots))

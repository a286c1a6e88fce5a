"""The one thread that runs every llama.cpp decode of the process.

This llama.cpp is built with OpenMP, and libgomp keeps a team of worker threads for each thread
that starts a parallel region. Once a process holds more of those threads than it has CPUs
(a second thread that decoded once is enough: the loading thread, then a server's worker or a
slot's thread), libgomp throttles every team's spin-wait to about a hundred turns, so each of a
decode's hundreds of barriers sleeps and wakes through the kernel: on 2 cores, `tandem serve`
decoded about 460 voluntary context switches a token per thread against 2 for `tandem generate`
(docs/design/architecture.md, "Resources"). Decoding on this one thread keeps one team whoever
asks, at the cost of a hand-over per call.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable, TypeVar

T = TypeVar("T")


class ComputeThread:
    def __init__(self, name: str = "tandem-compute") -> None:
        self.name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    @property
    def ident(self) -> int | None:
        """The thread's id once started (tests read it)."""
        return None if self._thread is None else self._thread.ident

    def run(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on the compute thread (at once when called from it), its result or its
        exception."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        self._ensure()
        done = threading.Event()
        box: list = []
        self._jobs.put((fn, args, box, done))
        done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def _ensure(self) -> None:
        with self._start_lock:
            # A forked child has the object but not the thread: it starts its own.
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self._thread.start()

    def _serve(self) -> None:
        while True:
            fn, args, box, done = self._jobs.get()
            try:
                box.append((True, fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
                box.append((False, exc))
            done.set()


# Every llama.cpp decode of the process (engine/llama/backend.py).
COMPUTE = ComputeThread()

"""Run one function per sequence on its own thread, as slots do, and raise the first error any
of them raised in the test's thread."""
from __future__ import annotations

import threading
from typing import Callable


def run_each(run: Callable[[int, list[BaseException]], None], n: int) -> None:
    """`run(k, errors)` for k in 0..n-1, each on a thread; `run` appends what it caught."""
    errors: list[BaseException] = []
    threads = [threading.Thread(target=run, args=(k, errors)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]

"""The page's per-browser-session state: stop requests (the pair holder and the queue the page
shares with the API are in app/runtime)."""
from __future__ import annotations

import threading


class StopFlags:
    """Per-browser-session stop requests: the stop button sets one, the running generator reads it."""

    def __init__(self) -> None:
        self._flags: dict[str, bool] = {}
        self._lock = threading.Lock()

    def begin(self, session: str) -> None:
        with self._lock:
            self._flags[session] = False

    def stop(self, session: str) -> None:
        with self._lock:
            self._flags[session] = True

    def stopped(self, session: str) -> bool:
        return self._flags.get(session, False)

    def end(self, session: str) -> None:
        with self._lock:
            self._flags.pop(session, None)

"""Turns committed tokens into text: incremental UTF-8 and stop strings.

Bytes of a multi-byte character can be split across tokens; the incremental decoder holds them
back until the character is complete. Text that could still become a stop string is held back
too, so a stop string never reaches the user.
"""
from __future__ import annotations

import codecs
from typing import Callable, Sequence


class TextStream:
    def __init__(self, token_bytes: Callable[[int], bytes], stop: Sequence[str] = ()) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = [s for s in stop if s]
        self._pending = ""
        self.text = ""
        self.stopped = False

    def push(self, token: int) -> str:
        """Feed one token; returns the text that can be shown now (maybe empty)."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(self._token_bytes(token))
        return self._release(final=False)

    def finish(self) -> str:
        if not self.stopped:
            self._pending += self._decoder.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        for s in self._stop:
            at = self._pending.find(s)
            if at >= 0:
                out = self._pending[:at]
                self._pending = ""
                self.stopped = True
                self.text += out
                return out
        hold = 0
        if not final:
            for s in self._stop:
                for k in range(min(len(s) - 1, len(self._pending)), 0, -1):
                    if self._pending.endswith(s[:k]):
                        hold = max(hold, k)
                        break
        cut = len(self._pending) - hold
        out, self._pending = self._pending[:cut], self._pending[cut:]
        self.text += out
        return out

"""What a piece of code reads from the files under a folder: which files it opens, how often,
and how many bytes it reads from each. Tests assert on these counts rather than on how long a
read took (issue 43: no assertion on wall time)."""
from __future__ import annotations

import builtins
import contextlib
import io
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator


@dataclass
class Reads:
    opens: Counter = field(default_factory=Counter)
    bytes: Counter = field(default_factory=Counter)


class _Counted:
    """A file object that adds what it reads to `reads`."""

    def __init__(self, f: Any, path: Path, reads: Reads) -> None:
        self._f, self._path, self._reads = f, path, reads

    def read(self, *args: Any) -> Any:
        data = self._f.read(*args)
        self._reads.bytes[self._path] += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        n = self._f.readinto(buffer)
        self._reads.bytes[self._path] += n or 0
        return n

    def __enter__(self) -> "_Counted":
        self._f.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._f.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


@contextlib.contextmanager
def counted(folder: Path) -> Iterator[Reads]:
    """Count the opens (builtins.open and io.open, which pathlib uses) of files under `folder`
    and the bytes read from them, while the block runs."""
    folder = Path(folder).resolve()
    reads = Reads()
    real_open = io.open

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        f = real_open(file, *args, **kwargs)
        if isinstance(file, (str, os.PathLike)):
            path = Path(file).resolve()
            if folder in path.parents:
                reads.opens[path] += 1
                return _Counted(f, path, reads)
        return f

    saved = builtins.open, io.open
    builtins.open = io.open = counting_open  # type: ignore[assignment]
    try:
        yield reads
    finally:
        builtins.open, io.open = saved

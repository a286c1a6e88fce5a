"""Putting a file into the model store atomically: it is written under a temporary name and
renamed into place, so a file that exists under its real name is complete; a failure or Ctrl-C
leaves nothing behind, and the next run writes it again. A full or read-only store is one
`ModelFileError` line."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from engine.errors import store_write_error


def write_atomically(out: Path, write: Callable[[Path], None]) -> Path:
    """`write` the file at a temporary path beside `out`, then rename it to `out`."""
    tmp = out.with_name(f"{out.stem}.{os.getpid()}.part")
    try:
        write(tmp)
        tmp.replace(out)
    except OSError as exc:
        raise store_write_error(out.name, out.parent, exc) from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return out

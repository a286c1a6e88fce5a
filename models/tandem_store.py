"""Where model files live on disk: the local store, outside the repository; the one SHA-256
hasher of model files; and what a failed write into the store says. Files are put into the
store by the one atomic write, models/atomic.py: written under a temporary name, fsynced and
renamed into place, so a file that exists under its real name is complete; a failure, Ctrl-C or
kill leaves nothing behind under that name, and the next run writes it again."""
from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Iterator

from engine.errors import ModelFileError, store_write_error


def tandem_home() -> Path:
    """Root for caches that outlive a clone (wheels, model chunks, models)."""
    return Path(os.environ.get("TANDEM_HOME", Path.home() / ".cache" / "tandem"))


def store_path() -> Path:
    """Where the model store is, created or not; `TANDEM_MODELS` overrides the default
    `~/.cache/tandem/models`."""
    env = os.environ.get("TANDEM_MODELS")
    return Path(env) if env else tandem_home() / "models"


def store_dir() -> Path:
    """The model store, created if missing."""
    return writable_dir(store_path())


def writable_dir(path: Path) -> Path:
    """`path`, created if missing; a folder that cannot be created is a one-line error. (One that
    exists but is read-only is found when a file is written into it, and said there.)"""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelFileError(f"cannot create the model store folder {path}: "
                             f"{exc.strerror or exc}; point TANDEM_MODELS at a writable folder") from None
    return path


def sha256_of(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def store_errors(out: Path) -> Iterator[None]:
    """Around a write of `out` into the store (models/atomic.py): a full or read-only store is
    one `ModelFileError` line."""
    try:
        yield
    except OSError as exc:
        raise store_write_error(out.name, out.parent, exc) from None

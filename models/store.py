"""Where model files live on disk: the local store, outside the repository."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from engine.errors import ModelFileError


def tandem_home() -> Path:
    """Root for caches that outlive a clone (wheels, model chunks, models)."""
    return Path(os.environ.get("TANDEM_HOME", Path.home() / ".cache" / "tandem"))


def store_dir() -> Path:
    """The model store; `TANDEM_MODELS` overrides the default `~/.cache/tandem/models`."""
    env = os.environ.get("TANDEM_MODELS")
    return writable_dir(Path(env) if env else tandem_home() / "models")


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

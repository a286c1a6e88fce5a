"""Where model files live on disk: the local store, outside the repository."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


def tandem_home() -> Path:
    """Root for caches that outlive a clone (wheels, model chunks, models)."""
    return Path(os.environ.get("TANDEM_HOME", Path.home() / ".cache" / "tandem"))


def store_dir() -> Path:
    """The model store; `TANDEM_MODELS` overrides the default `~/.cache/tandem/models`."""
    env = os.environ.get("TANDEM_MODELS")
    path = Path(env) if env else tandem_home() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256_of(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()

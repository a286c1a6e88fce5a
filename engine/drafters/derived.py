"""Model files Tandem derives from the user's GGUFs (early-exit and requantized drafts): where
they live in the store, and the SHA-256 that ties each one to the file it came from."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def derived_dir() -> Path:
    from models.store import store_dir
    d = store_dir() / "derived"
    d.mkdir(parents=True, exist_ok=True)
    return d


def file_sha256(path: Path) -> str:
    """SHA-256 of a model file, remembered in a sidecar while its size and mtime are unchanged."""
    path = Path(path).resolve()
    st = path.stat()
    sidecar = derived_dir() / "sha256-cache.json"
    try:
        cache: dict = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        cache = {}
    entry = cache.get(str(path))
    if entry and entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns:
        return str(entry["sha256"])
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    digest = h.hexdigest()
    cache[str(path)] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    tmp = sidecar.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cache, indent=1))
    tmp.replace(sidecar)
    return digest

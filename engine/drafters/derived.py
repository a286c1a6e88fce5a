"""Model files Tandem derives from the user's GGUFs (early-exit, requantized and
vocabulary-trimmed drafts): where they live in the store, the SHA-256 that ties each one to the
file it came from, and how one is put in place. A derived file's name carries its source's hash
and appears only by atomic rename, so one that exists is complete and current: callers return it
without reading the source again."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

from engine.atomic import write_atomically
from engine.errors import ModelFileError, store_write_error


def derived_dir() -> Path:
    from models.store import store_dir, writable_dir
    return writable_dir(store_dir() / "derived")


def source_sha256(source: str | Path) -> tuple[Path, str]:
    """The model file a derived file is built from, and its SHA-256; a clear error if missing."""
    source = Path(source)
    if not source.is_file():
        raise ModelFileError(f"model file not found: {source}")
    return source, file_sha256(source)


def file_sha256(path: Path) -> str:
    """SHA-256 of a model file, remembered in a sidecar while the file is the same one: same
    size, mtime, inode and ctime. A file replaced by another (renamed over it, or copied with its
    mtime kept) gets a new inode or ctime, so it is hashed again (issue 21)."""
    path = Path(path).resolve()
    st = path.stat()
    sidecar = derived_dir() / "sha256-cache.json"
    try:
        cache: dict = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        cache = {}
    stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino,
             "ctime_ns": st.st_ctime_ns}
    entry = cache.get(str(path))
    if entry and all(entry.get(k) == v for k, v in stamp.items()):
        return str(entry["sha256"])
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    digest = h.hexdigest()
    cache[str(path)] = {**stamp, "sha256": digest}
    tmp = sidecar.with_suffix(f".{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(cache, indent=1))
        tmp.replace(sidecar)
    except OSError:
        # The sidecar only saves a re-read: a full or read-only store must not stop a load.
        tmp.unlink(missing_ok=True)
    return digest


def publish(out: Path, stale: str, write: Callable[[Path], None]) -> Path:
    """Put a derived file at `out`: remove older builds (files of the store's derived folder
    matching the glob `stale`), `write` a temporary file and rename it into place, so a file
    that exists under its hash-bearing name is always complete. Nothing is left on failure, nor
    on Ctrl-C (the next run builds it again). A full or read-only store is a ModelFileError."""
    try:
        for old in derived_dir().glob(stale):
            old.unlink()
    except OSError as exc:
        raise store_write_error(out.name, out.parent, exc) from None
    return write_atomically(out, write)

"""Model files Tandem derives from the user's GGUFs (requantized, early-exit and
vocabulary-trimmed drafts): the one rule for where they live in the store, the SHA-256 that ties
each one to the file it came from, and how one is built and put in place.

A derived file is named `<source stem>.<tag>.<first 16 hex of the source's SHA-256>.gguf` in
the store's `derived/` folder, where the tag says what was derived ("q4_0", "early-exit-21",
"vocab-49152"). It appears only by atomic rename, so one that exists is complete and current:
`derive` returns it without reading the source again. A changed source gets a new name, and
building it removes the stale builds of the same tag.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from engine.errors import ModelFileError
from models.atomic import write_atomically, write_text
from models.tandem_store import sha256_of, store_dir, store_errors, store_path, writable_dir

# prepare(source, sha) checks the source and returns the function that writes the derived file
# to a given path; it runs only when no current file exists.
Prepare = Callable[[Path, str], Callable[[Path], None]]


def derived_dir() -> Path:
    return writable_dir(store_dir() / "derived")


def derived_path(source: str | Path, tag: str, sha: str) -> Path:
    """Where the file derived from `source` (of SHA-256 `sha`) under `tag` lives."""
    return derived_dir() / f"{Path(source).stem}.{tag}.{sha[:16]}.gguf"


def is_build_of(name: str, source: str | Path, tag: str) -> bool:
    """Whether a file named `name` in `derived/` is a build of `source` under `tag` (of any
    source hash), as `derived_path` names one: exactly `<stem>.<tag>.<16 hex>.gguf`. A glob's `*`
    would also match what another source's stem continues with (`a.q4_0.*.gguf` matches
    `a.q4_0.b.q4_0.<hash>.gguf`, a build of `a.q4_0.b`)."""
    head, tail = f"{Path(source).stem}.{tag}.", ".gguf"
    sha = name[len(head):-len(tail)]
    return (name.startswith(head) and name.endswith(tail) and len(sha) == 16
            and all(c in "0123456789abcdef" for c in sha))


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
    digest = sha256_of(path)
    cache[str(path)] = {**stamp, "sha256": digest}
    try:
        write_text(sidecar, json.dumps(cache, indent=1))
    except OSError:
        pass  # the sidecar only saves a re-read: a full or read-only store must not stop a load
    return digest


def current_build(source: str | Path, tag: str) -> Path | None:
    """The store's current build of `source` under `tag`, or None: for a plan, which derives
    nothing and creates no folder. The source is hashed (or its hash read from the sidecar)
    only where a build of the tag exists."""
    source, folder = Path(source), store_path() / "derived"
    if not folder.is_dir() or not source.is_file() or not any(
            is_build_of(p.name, source, tag) for p in folder.glob(f"{source.stem}.{tag}.*.gguf")):
        return None
    out = folder / f"{source.stem}.{tag}.{file_sha256(source)[:16]}.gguf"
    return out if out.is_file() else None


def derive(source: str | Path, tag: str, prepare: Prepare) -> Path:
    """The file derived from `source` under `tag`: the current one when it exists, else
    `prepare(source, sha)`'s writer builds it (older builds of the tag are removed first). The
    write goes to a temporary file renamed into place, so nothing is left on failure, nor on
    Ctrl-C (the next run builds it again). A full or read-only store is a ModelFileError."""
    source, sha = source_sha256(source)
    out = derived_path(source, tag, sha)
    # Current (the name carries the hash); re-reading a large source would cost seconds.
    if out.is_file():
        return out
    write = prepare(source, sha)
    with store_errors(out):
        for old in derived_dir().glob(f"{source.stem}.{tag}.*.gguf"):
            if is_build_of(old.name, source, tag):
                old.unlink()
        return write_atomically(out, write)

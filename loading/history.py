"""Past prompts and answers on disk: the history the suffix drafter copies from
(engine/drafters/history_index.py), one file per tokenizer and owner.

    $TANDEM_HISTORY (default ~/.cache/tandem/history)/
        <tokenizer>/local.npz          the app's and the command line's history
        <tokenizer>/key-<hash>.npz     `tandem serve`'s, one per API key (a hash, never the key)

`<tokenizer>` is a hash of the vocabulary's token strings (the GGUF header's), so a model with
another vocabulary never reads ids that mean other text to it. Folders are created user-only
(0700) and files written user-only (0600): the history holds everything the user asked.
A file is written through models/atomic.py (a temporary name, fsync, rename, fsync of the
folder), so a crash or kill mid-write leaves the previous file whole; a file that cannot be read
is set aside as `<name>.corrupt-<time>` (nothing is lost) and the history starts empty.

Several generations add to one owner's history at once (`tandem serve --parallel N`, one key):
the index takes its own lock for each change, and `save` holds the owner's lock from the
snapshot to the rename, so saves of one file go one at a time and each writes the index as it
is then: the last save's file holds every answer added before it, never an older snapshot
renamed over a newer one.
"""
from __future__ import annotations

import hashlib
import os
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.drafters.history_index import HistoryIndex
from engine.errors import SettingsError
from models.atomic import set_aside, write_atomically
from models.gguf_info import GGUFInfo
from models.tandem_store import tandem_home

FORMAT = 1
LOCAL = "local"


def history_root() -> Path:
    """Where histories live; `TANDEM_HISTORY` overrides the default."""
    env = os.environ.get("TANDEM_HISTORY")
    return Path(env) if env else tandem_home() / "history"


def owner_for_key(api_key: str) -> str:
    """The file name of an API key's history: a hash, so the key is not on disk."""
    return "key-" + hashlib.sha256(api_key.encode("utf-8")).hexdigest()[:16]


def tokenizer_id(model: GGUFInfo) -> str:
    """The hash that names a model's histories: its token strings' SHA-256 (`model` is its
    header, read once by the load's plan), shortened."""
    return model.tokens_sha256[:16]


def _private_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path, 0o700)
    except OSError as exc:
        raise SettingsError(f"cannot create the history folder {path}: {exc.strerror or exc}; "
                            "point TANDEM_HISTORY at a writable folder or use --no-history") from None
    return path


class HistoryStore:
    """The histories of one tokenizer: loaded on first use, kept in memory, saved on `save`."""

    def __init__(self, tokenizer: str, capacity: int, root: Path | None = None) -> None:
        if capacity < 16:
            raise SettingsError(f"history size must be at least 16 tokens, got {capacity}")
        self.tokenizer = tokenizer
        self.capacity = capacity
        self.root = root or history_root()
        self._indexes: dict[str, HistoryIndex] = {}
        self._lock = threading.Lock()
        # One per owner: held by `save` and `clear` over the file (the module's docstring).
        self._writing: dict[str, threading.Lock] = {}

    @classmethod
    def for_model(cls, model: GGUFInfo, capacity: int,
                  root: Path | None = None) -> "HistoryStore":
        return cls(tokenizer_id(model), capacity, root)

    def path(self, owner: str = LOCAL) -> Path:
        return self.root / self.tokenizer / f"{owner}.npz"

    def index(self, owner: str = LOCAL) -> HistoryIndex:
        """Owner's history, read from disk the first time."""
        with self._lock:
            index = self._indexes.get(owner)
            if index is None:
                index = self._indexes[owner] = self._read(owner)
            return index

    def _writer(self, owner: str) -> threading.Lock:
        with self._lock:
            return self._writing.setdefault(owner, threading.Lock())

    def _read(self, owner: str) -> HistoryIndex:
        path = self.path(owner)
        if not path.exists():
            return HistoryIndex(self.capacity)
        try:
            with np.load(path, allow_pickle=False) as f:
                if int(f["format"][0]) != FORMAT or str(f["tokenizer"][()]) != self.tokenizer:
                    raise ValueError("written for another format or tokenizer")
                state = {k: f[k] for k in ("tokens", "starts", "stamps", "clock")}
            return HistoryIndex.restore(state, self.capacity)
        except (OSError, ValueError, KeyError, IndexError, zipfile.BadZipFile) as exc:
            set_aside(path, "the history", f"{exc}; it starts empty")
            return HistoryIndex(self.capacity)

    def save(self, owner: str = LOCAL) -> None:
        """Write owner's history atomically (nothing to do if it was never read), one save of
        a file at a time, from a snapshot taken with the file's lock held."""
        index = self._indexes.get(owner)
        if index is None:
            return
        out = self.path(owner)
        with self._writer(owner):
            state = index.state()
            _private_dir(out.parent)
            _private_dir(self.root)

            def write(tmp: Path) -> None:
                with open(tmp, "wb") as f:
                    arrays: dict[str, Any] = {"format": np.array([FORMAT]),
                                              "tokenizer": np.array(self.tokenizer), **state}
                    np.savez(f, **arrays)

            try:
                write_atomically(out, write, private=True)
            except OSError as exc:
                raise SettingsError(f"cannot save the history {out}: {exc.strerror or exc}; "
                                    "use --no-history to run without one") from None

    def clear(self, owner: str = LOCAL) -> None:
        """Empty owner's history in memory and on disk."""
        with self._writer(owner):
            with self._lock:
                index = self._indexes.get(owner)
            if index is not None:
                index.clear()
            self.path(owner).unlink(missing_ok=True)


@dataclass(frozen=True)
class History:
    """One owner's history in a store: what a generation drafts from (`index`, passed to
    `Pair.generate`, which adds the prompt and answer when it ends) and `save` afterwards."""

    store: HistoryStore
    owner: str = LOCAL

    @property
    def index(self) -> HistoryIndex:
        return self.store.index(self.owner)

    def save(self) -> None:
        self.store.save(self.owner)


@dataclass(frozen=True)
class HistoryFile:
    tokenizer: str
    owner: str
    path: Path
    size: int


def history_files(root: Path | None = None) -> list[HistoryFile]:
    """Every history on disk (set-aside unreadable files included)."""
    root = root or history_root()
    if not root.is_dir():
        return []
    out = []
    for path in sorted(root.glob("*/*.npz*")):
        if path.name.endswith(".part"):
            continue
        owner = path.name.split(".npz")[0]
        out.append(HistoryFile(path.parent.name, owner, path, path.stat().st_size))
    return out


def clear_histories(root: Path | None = None) -> list[HistoryFile]:
    """Delete every history on disk; returns what was deleted."""
    gone = history_files(root)
    for f in gone:
        f.path.unlink(missing_ok=True)
    for folder in {f.path.parent for f in gone}:
        try:
            folder.rmdir()
        except OSError:
            pass
    return gone

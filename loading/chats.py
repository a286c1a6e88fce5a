"""The app's saved conversations: one JSON file per chat, user-only, in a store of Tandem's own.

    $TANDEM_CHATS (default ~/.cache/tandem/chats)/
        <id>.json      one chat: title, times, system prompt, settings, messages
        last.json      which chat the page had open last (a restart reopens it)

The folder is created user-only (0700) and every file written user-only (0600) through the one
atomic write (models/atomic.py), so a kill mid-save leaves the previous file whole. A chat file
that cannot be read is set aside as `<name>.corrupt-<time>` (models/atomic.py) and left out of
the list. Chats are listed newest first (by their last change). Ids are made here and checked
on the way in, so no id names a path outside the store.

Each chat has a revision, counted up by every save of its turns. A save names the revision it
was read at and is refused (`ChatChanged`) when the file holds another: two tabs on one chat
cannot overwrite each other's turns, the second learns that the chat changed elsewhere. The
check and the write are one step under the store's lock (one process; two processes on one
store still write whole files, but could both pass the check at the same instant). A rename
and a changed system prompt change no turn, so they move no revision, and a save keeps the name
a rename gave. Chats saved before revisions (none in the file) are revision 0.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from engine.errors import SettingsError
from models.atomic import set_aside, write_text
from models.tandem_store import tandem_home

FORMAT = 1
LAST = "last.json"
# A chat's title, when nobody named it: its first message, cut to this many characters.
TITLE_CHARS = 48
UNTITLED = "New chat"
_ID = re.compile(r"^[0-9]{14}-[0-9a-f]{8}$")
ROLES = ("system", "user", "assistant")


def chats_root() -> Path:
    """Where chats live; `TANDEM_CHATS` overrides the default."""
    env = os.environ.get("TANDEM_CHATS")
    return Path(env) if env else tandem_home() / "chats"


@dataclass(frozen=True)
class Chat:
    """One conversation: its messages (`{"role", "content"}`, user and assistant), the system
    prompt it runs with, and the settings of its page (by the controls' names)."""
    id: str
    title: str = UNTITLED
    created: float = 0.0
    updated: float = 0.0
    system: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    messages: tuple[dict, ...] = ()
    # True once someone renamed it: the first message no longer names it.
    named: bool = False
    # Counted up by each save of its turns (the store checks it, above).
    revision: int = 0
    # The pair and loader settings its last turn ran on, by the loader's names (target, draft,
    # ctx, gpu_layers, ...): a reopened chat says which differ from the pair loaded then.
    pair: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict:
        return {"format": FORMAT, **asdict(self), "messages": [dict(m) for m in self.messages]}

    @classmethod
    def from_json(cls, data: dict) -> "Chat":
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, not {FORMAT}")
        messages = tuple({"role": str(m["role"]), "content": str(m["content"])}
                         for m in data["messages"])
        if any(m["role"] not in ROLES for m in messages):
            raise ValueError("a message has an unknown role")
        return cls(id=str(data["id"]), title=str(data["title"]), created=float(data["created"]),
                   updated=float(data["updated"]), system=str(data.get("system", "")),
                   settings=dict(data.get("settings") or {}), messages=messages,
                   named=bool(data.get("named", False)), revision=int(data.get("revision", 0)),
                   pair=dict(data.get("pair") or {}))


class ChatChanged(SettingsError):
    """A save from a page that had not seen the chat's latest turns (another tab saved since)."""


def title_of(messages: tuple[dict, ...] | list[dict]) -> str:
    """The title a chat gets from its first user message."""
    first = next((m["content"] for m in messages if m["role"] == "user"), "")
    words = " ".join(str(first).split())
    if not words:
        return UNTITLED
    return words if len(words) <= TITLE_CHARS else words[:TITLE_CHARS - 1].rstrip() + "…"


class ChatStore:
    """The chats under `root`; `now` (seconds) stamps changes (a fixed clock in tests)."""

    def __init__(self, root: Path | None = None, now: Callable[[], float] = time.time) -> None:
        self.root = Path(root) if root is not None else chats_root()
        self.now = now
        # The page saves from several sessions' threads; a save of one chat is one write.
        self._lock = threading.Lock()

    def _dir(self) -> Path:
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(self.root, 0o700)
        except OSError as exc:
            raise SettingsError(f"cannot create the chats folder {self.root}: "
                                f"{exc.strerror or exc}; point TANDEM_CHATS at a writable "
                                "folder") from None
        return self.root

    def path(self, chat_id: str) -> Path:
        if not _ID.match(chat_id or ""):
            raise SettingsError(f"not a chat id: {chat_id!r}")
        return self.root / f"{chat_id}.json"

    def new(self, system: str = "", settings: dict[str, Any] | None = None) -> Chat:
        """A fresh chat (not on disk until it is saved)."""
        t = self.now()
        stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(t))
        return Chat(id=f"{stamp}-{secrets.token_hex(4)}", created=t, updated=t, system=system,
                    settings=dict(settings or {}))

    def save(self, chat: Chat, touch: bool = True) -> Chat:
        """Write `chat` as the next revision after `chat.revision` (its title follows its first
        message unless renamed, here or on disk); with `touch` it becomes the newest. Returns
        the chat as written. ChatChanged when the chat on disk is not at `chat.revision`: it
        changed (or was deleted) elsewhere since it was read, and nothing is written."""
        with self._lock:
            held = self.get(chat.id)
            at = held.revision if held is not None else 0
            if at != chat.revision:
                raise ChatChanged(f"chat {chat.id} changed elsewhere (another tab or window) "
                                  f"since it was read (revision {at}, not {chat.revision}): "
                                  "reload it")
            if held is not None and held.named and not chat.named:
                chat = replace(chat, title=held.title, named=True)
            chat = self._put(chat, touch, revision=at + 1)
        return chat

    def _put(self, chat: Chat, touch: bool, revision: int) -> Chat:
        """Write `chat` at `revision` (the caller holds the lock)."""
        if not chat.named:
            chat = replace(chat, title=title_of(chat.messages))
        chat = replace(chat, revision=revision, updated=self.now() if touch else chat.updated)
        self._write(self.path(chat.id), json.dumps(chat.as_json(), ensure_ascii=False, indent=1))
        return chat

    def _change(self, chat_id: str, **fields: Any) -> Chat:
        """The chat on disk with `fields` changed, written at its revision: a change to no turn
        (a name, the system prompt), which no page's turns conflict with."""
        with self._lock:
            chat = self._existing(chat_id)
            return self._put(replace(chat, **fields), touch=False, revision=chat.revision)

    def _write(self, out: Path, text: str) -> None:
        self._dir()
        try:
            write_text(out, text, private=True)
        except OSError as exc:
            raise SettingsError(f"cannot save the chat into {self.root}: "
                                f"{exc.strerror or exc}") from None

    def get(self, chat_id: str) -> Chat | None:
        """The chat, or None when it is not there (or could not be read: set aside)."""
        path = self.path(chat_id)
        try:
            return Chat.from_json(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            set_aside(path, "chat", exc)
            return None

    def list(self) -> list[Chat]:
        """Every readable chat, newest first."""
        if not self.root.is_dir():
            return []
        chats = [self.get(p.stem) for p in self.root.glob("*.json") if _ID.match(p.stem)]
        return sorted((c for c in chats if c is not None), key=lambda c: (c.updated, c.id),
                      reverse=True)

    def rename(self, chat_id: str, title: str) -> Chat:
        title = " ".join(title.split())
        if not title:
            raise SettingsError("a chat's name cannot be empty")
        return self._change(chat_id, title=title, named=True)

    def set_system(self, chat_id: str, system: str) -> Chat:
        """The chat's system prompt changed, its turns not (the next turn's save keeps it too)."""
        return self._change(chat_id, system=system)

    def delete(self, chat_id: str) -> None:
        path = self.path(chat_id)
        with self._lock:
            path.unlink(missing_ok=True)

    def _existing(self, chat_id: str) -> Chat:
        chat = self.get(chat_id)
        if chat is None:
            raise SettingsError(f"no chat {chat_id!r} in {self.root} (deleted in another tab?)")
        return chat

    def remember(self, chat_id: str) -> None:
        """Note `chat_id` as the one open last."""
        self.path(chat_id)
        with self._lock:
            self._write(self.root / LAST, json.dumps({"format": FORMAT, "id": chat_id}))

    def last(self) -> Chat | None:
        """The chat open last, else the newest, else None."""
        try:
            data = json.loads((self.root / LAST).read_text(encoding="utf-8"))
            chat = self.get(str(data["id"]))
        except (OSError, ValueError, KeyError, TypeError, SettingsError):
            chat = None
        if chat is not None:
            return chat
        chats = self.list()
        return chats[0] if chats else None

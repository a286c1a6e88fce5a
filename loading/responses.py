"""Stored Responses (`/v1/responses` with `store: true`, the default): each response kept with
the conversation it ends, so a later request continues from it (`previous_response_id`) and
`GET` / `DELETE /v1/responses/{id}` find it.

    $TANDEM_HOME/responses/<owner>/<id>.json

`<owner>` is the API key's (loading/history.py `owner_for_key`: a hash, never the key), or
`local`; a request sees only its own owner's folder, so another key's id is not found. The
files hold what the user sent and got: folders are created 0700, files written 0600 through
models/atomic.py (whole or not at all), one put of an owner's folder at a time.

Bounded: an owner keeps at most `MAX_RESPONSES` responses and `MAX_BYTES` of them, none older
than `MAX_AGE_S` (OpenAI keeps 30 days). Each put evicts the oldest-written first until the
folder is within all three (never the one just written). A file that cannot be read is set
aside as `<name>.corrupt-<time>` and counts as not found.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

from models.atomic import set_aside, write_text
from models.tandem_store import tandem_home

MAX_RESPONSES = 500
MAX_BYTES = 64 * 1024 * 1024
MAX_AGE_S = 30 * 24 * 3600
# The ids this server makes (app/serve/responses_objects.py): anything else is not one.
ID_PATTERN = re.compile(r"^resp_[0-9a-f]{32}$")
OWNER_PATTERN = re.compile(r"^(local|key-[0-9a-f]{16})$")


def responses_root() -> Path:
    """Where stored responses live; `TANDEM_RESPONSES` overrides the default."""
    env = os.environ.get("TANDEM_RESPONSES")
    return Path(env) if env else tandem_home() / "responses"


class ResponseStore:
    """Every owner's stored responses under `root`."""

    def __init__(self, root: Path | None = None, max_responses: int = MAX_RESPONSES,
                 max_bytes: int = MAX_BYTES, max_age_s: float = MAX_AGE_S) -> None:
        self.root = root or responses_root()
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._lock = threading.Lock()

    def _folder(self, owner: str) -> Path:
        if not OWNER_PATTERN.match(owner):
            raise ValueError(f"not an owner of stored responses: {owner!r:.40}")
        return self.root / owner

    def _path(self, owner: str, response_id: str) -> Path | None:
        return self._folder(owner) / f"{response_id}.json" if ID_PATTERN.match(response_id) \
            else None

    def get(self, owner: str, response_id: str) -> dict | None:
        """The record stored as `response_id` for `owner`; None when there is none."""
        path = self._path(owner, response_id)
        if path is None:
            return None
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            return None
        try:
            record = json.loads(text)
            if not isinstance(record, dict) or record.get("id") != response_id:
                raise ValueError("not a stored response")
        except ValueError as exc:
            set_aside(path, "a stored response", exc)
            return None
        return record

    def put(self, owner: str, record: dict) -> None:
        """Keep `record` (its `id` names it), then evict down to the bounds."""
        path = self._path(owner, str(record.get("id")))
        if path is None:
            raise ValueError(f"not a response id: {record.get('id')!r:.60}")
        text = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
        with self._lock:
            for folder in (self.root, path.parent):
                folder.mkdir(parents=True, exist_ok=True, mode=0o700)
                os.chmod(folder, 0o700)
            write_text(path, text, private=True)
            self._evict(path)

    def delete(self, owner: str, response_id: str) -> bool:
        """Forget `response_id`; False when `owner` had no such response."""
        path = self._path(owner, response_id)
        if path is None:
            return False
        with self._lock:
            try:
                path.unlink()
            except FileNotFoundError:
                return False
        return True

    def _evict(self, kept: Path) -> None:
        """The oldest-written first, until the folder is within the bounds (`kept` stays)."""
        files = []
        for p in kept.parent.glob("resp_*.json"):
            try:
                st = p.stat()
            except OSError:
                continue
            files.append((st.st_mtime, p.name, st.st_size, p))
        files.sort()
        count, total, now = len(files), sum(f[2] for f in files), time.time()
        for mtime, _, size, p in files:
            if count <= self.max_responses and total <= self.max_bytes \
                    and now - mtime <= self.max_age_s:
                break
            if p != kept:
                p.unlink(missing_ok=True)
                count, total = count - 1, total - size

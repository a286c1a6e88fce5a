"""How every store Tandem keeps on disk writes a file: all of it or nothing, even when the
process is killed mid-write or the machine loses power.

The file is written under a temporary name in the same folder (`.<name>.<pid>.<random>.part`,
hidden, and matching no store's pattern), flushed and fsynced, renamed over the real name, and
the folder is fsynced so the rename itself is on disk. A reader therefore finds the old file or
the new one, never a torn one. Content that is the user's (the history of their prompts) is
created user-only (0600) before a byte is written.

This is the one atomic write: every store writes through `write_atomically` (or `write_text`,
`write_bytes`; a download that resumes puts its finished `.part` in place with
`move_into_place`). `on_step` is a test seam: the kill tests (tests/test_store_kills.py) set it in
a child process to kill that writer at a chosen step of a write; it is None otherwise.

A process killed mid-write leaves its temporary file; the next write in the same folder removes
those whose process is gone. A file a reader cannot parse anyway (written by an older version
without fsync before a power loss, or edited by hand) is set aside as `<name>.corrupt-<time>`
with one warning line, so nothing is lost and the store starts afresh.
"""
from __future__ import annotations

import datetime as dt
import os
import re
import secrets
import sys
from pathlib import Path
from typing import Callable

PRIVATE = 0o600

# The steps of a write, in order, as `on_step` sees them: the temporary file holds every byte
# ("written"), is on disk ("synced"), has replaced the real name ("renamed"; the folder is not
# yet synced).
STEPS = ("written", "synced", "renamed")

# Called as on_step(step, tmp, out) at each step; a test seam (see the docstring), None otherwise.
on_step: Callable[[str, Path, Path], None] | None = None


def _step(step: str, tmp: Path, out: Path) -> None:
    if on_step is not None:
        on_step(step, tmp, out)


def temp_path(out: Path) -> Path:
    """A fresh temporary name beside `out`, unique to this process and call."""
    return out.with_name(f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.part")


def _pid_alive(pid: int) -> bool:
    if os.name == "nt":
        return True  # os.kill(pid, 0) would terminate it there; its leftovers stay
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM): alive
        return True
    return True


# `temp_path`'s names: the file's, the writer's pid, random hex digits.
_TEMP = re.compile(r"^\..+\.(\d+)\.[0-9a-f]+\.part$")


def remove_orphans(out: Path) -> None:
    """Remove the temporary files in `out`'s folder left by processes that were killed
    mid-write: of `out`, and of any other file there (a store of one file per item, such as the
    stored responses, never writes a killed writer's item again)."""
    try:
        leftovers = list(out.parent.glob(".*.part"))
    except OSError:
        return
    for tmp in leftovers:
        found = _TEMP.match(tmp.name)
        if found is None:
            continue
        pid = int(found.group(1))
        if pid != os.getpid() and not _pid_alive(pid):
            tmp.unlink(missing_ok=True)


def fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (a no-op where folders cannot be opened: Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a folder; the rename is still atomic
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def move_into_place(tmp: Path, out: Path) -> Path:
    """Put a complete file written at `tmp` (in `out`'s folder) in place as `out`: fsync it,
    rename it over `out`, fsync the folder. An OSError leaves `tmp` where it was."""
    _fsync_file(tmp)
    _step("synced", tmp, out)
    os.replace(tmp, out)
    _step("renamed", tmp, out)
    fsync_dir(out.parent)
    return out


def write_atomically(out: Path, write: Callable[[Path], object], *, private: bool = False) -> Path:
    """`write(tmp)` writes the whole file at a temporary path beside `out`, which then replaces
    `out` durably. `private`: the file is created 0600 before `write` runs. On any failure (an
    OSError, Ctrl-C) the temporary file is removed and the exception goes on; `out` is as it was."""
    out = Path(out)
    remove_orphans(out)
    tmp = temp_path(out)
    try:
        if private:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE))
        write(tmp)
        if private:
            os.chmod(tmp, PRIVATE)  # in case `write` replaced the file rather than filling it
        _step("written", tmp, out)
        move_into_place(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def write_bytes(out: Path, data: bytes, *, private: bool = False) -> Path:
    """`data` as the whole of `out`, atomically and durably."""
    return write_atomically(Path(out), lambda tmp: tmp.write_bytes(data), private=private)


def write_text(out: Path, text: str, *, private: bool = False) -> Path:
    """`text` (UTF-8) as the whole of `out`, atomically and durably."""
    return write_bytes(out, text.encode("utf-8"), private=private)


def set_aside(path: Path, what: str, reason: object) -> Path | None:
    """A file that cannot be read: rename it to `<name>.corrupt-<UTC time>` and say so in one
    line on stderr. Returns the new path (None when even the rename failed: then the file is
    left, and the warning says so)."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    reason_line = " ".join(str(reason).split())
    try:
        os.replace(path, aside)
    except OSError as exc:
        print(f"warning: {what} {path} could not be read ({reason_line}) nor set aside "
              f"({exc.strerror or exc}); it is ignored", file=sys.stderr)
        return None
    print(f"warning: {what} {path} could not be read ({reason_line}); it was set aside as "
          f"{aside.name}", file=sys.stderr)
    return aside

"""models/atomic.py, the one write every store goes through: whole or nothing, user-only when
asked, a killed writer's leftovers removed (only once its process is gone), an unreadable file
set aside with one line. (Kills inside a write: tests/test_store_kills.py, through `on_step`.)"""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from models import atomic


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    out = atomic.write_text(tmp_path / "f.json", "old")

    def fails(tmp):
        tmp.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        atomic.write_atomically(out, fails)
    assert out.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_the_steps_come_in_order_and_the_real_name_changes_only_at_the_rename(tmp_path,
                                                                           monkeypatch):
    out = atomic.write_text(tmp_path / "f.json", "old")
    seen = []

    def step(name, tmp, target):
        seen.append((name, tmp.exists(), target.read_text()))

    monkeypatch.setattr(atomic, "on_step", step)
    atomic.write_text(out, "new")
    assert [name for name, _, _ in seen] == list(atomic.STEPS)
    # Written and synced under the temporary name with the old file in place; then renamed.
    assert seen == [("written", True, "old"), ("synced", True, "old"), ("renamed", False, "new")]


def test_private_files_are_user_only_and_others_keep_the_umask(tmp_path):
    private = atomic.write_bytes(tmp_path / "p", b"x", private=True)
    shared = atomic.write_bytes(tmp_path / "s", b"x")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(shared.stat().st_mode) == 0o666 & ~umask


def test_leftovers_of_a_dead_writer_go_and_those_of_a_live_one_stay(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    gone = tmp_path / f".f.json.{dead}.abcd.part"
    alive = tmp_path / f".f.json.{os.getppid()}.abcd.part"
    # Another file's, in the same folder (a store of a file per item never writes that item
    # again), goes too; one of a live writer, or not named as a temporary file is, stays.
    other = tmp_path / f".g.json.{dead}.abcd.part"
    other_alive = tmp_path / f".g.json.{os.getppid()}.abcd.part"
    not_ours = tmp_path / f".g.json.{dead}.part"
    for p in (gone, alive, other, other_alive, not_ours):
        p.write_text("partial")
    atomic.write_text(tmp_path / "f.json", "new")
    assert not gone.exists() and not other.exists()
    assert alive.exists() and other_alive.exists() and not_ours.exists()


def test_an_unreadable_file_is_set_aside_with_one_line(tmp_path, capsys):
    bad = tmp_path / "r.json"
    bad.write_text("{not json")
    aside = atomic.set_aside(bad, "the record", "Expecting value:\nline 1")
    err = capsys.readouterr().err
    assert aside is not None and aside.name.startswith("r.json.corrupt-")
    assert aside.read_text() == "{not json" and not bad.exists()
    assert len(err.splitlines()) == 1 and aside.name in err

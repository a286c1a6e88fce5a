"""A derived build removes only the older builds of its own source and tag
(loading/derived/files.py): `derived/` is shared by every source, and a glob's `*` also matches
what another source's stem continues with."""
from __future__ import annotations

from loading.derived import files
from loading.derived.files import derive, is_build_of


def _prepare(source, sha):
    return lambda out: out.write_bytes(b"derived from " + sha.encode())


def _builds(tmp_path, monkeypatch):
    """A build of `a.q4_0.b.gguf`, then two of `a.gguf` (its source changed between them)."""
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "store"))
    source, other = tmp_path / "a.gguf", tmp_path / "a.q4_0.b.gguf"
    source.write_bytes(b"one")
    other.write_bytes(b"another model")
    theirs = derive(other, "q4_0", _prepare)
    old = derive(source, "q4_0", _prepare)
    source.write_bytes(b"changed")
    new = derive(source, "q4_0", _prepare)
    return theirs, old, new


def test_a_new_build_removes_its_own_old_builds_and_no_other_sources(tmp_path, monkeypatch):
    theirs, old, new = _builds(tmp_path, monkeypatch)
    assert new.is_file() and new != old and not old.exists()
    assert theirs.is_file()


def test_the_old_glob_alone_removes_another_sources_build(tmp_path, monkeypatch):
    # The negative control: every file the glob matches taken for a build of the source.
    monkeypatch.setattr(files, "is_build_of", lambda name, source, tag: True)
    theirs, old, new = _builds(tmp_path, monkeypatch)
    assert new.is_file() and not old.exists() and not theirs.exists()


def test_a_build_name_is_exactly_stem_tag_and_hash():
    sha = "0123456789abcdef"
    assert is_build_of(f"a.q4_0.{sha}.gguf", "x/a.gguf", "q4_0")
    for name in (f"a.q4_0.b.q4_0.{sha}.gguf", f"a.q4_0.{sha}0.gguf", f"a.q4_0.{sha}.gguf.part",
                 f"a.vocab-5.{sha}.gguf", f"b.q4_0.{sha}.gguf", "a.q4_0.0123456789ABCDEF.gguf"):
        assert not is_build_of(name, "a.gguf", "q4_0"), name

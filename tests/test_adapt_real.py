"""llama.cpp's trainer on the embedded draft (issue 45, long): one optimizer step on the output
head moves the adapted draft's logits and nothing else in the file, and `tandem adapt`'s copies
load in llama.cpp."""
from __future__ import annotations

import numpy as np
import pytest

from engine.backend import ModelConfig
from engine.llama.backend import quiet_backend
from engine.llama.training import SGD, Trainer
from loading.derived.trainable import trains, write_adapted, write_trainable
from models.gguf_file import GGUFFile
from models.gguf_info import read_info
from tests.realmodels import embedded_pair

pytestmark = pytest.mark.long


def test_one_step_on_the_head_moves_the_adapted_drafts_logits(tmp_path):
    _, draft = embedded_pair()
    chosen = trains("head", read_info(draft).n_layer)
    names = write_trainable(draft, tmp_path / "t.gguf", chosen)
    with Trainer(tmp_path / "t.gguf", 256, chosen, 1e-3, threads=1) as trainer:
        assert sorted(trainer.trained) == ["output.weight", "output_norm.weight"]
        window = [int(t) for t in np.random.default_rng(0).integers(1000, 20000, 257)]
        first, accuracy = trainer.step(window[:-1], window[1:])
        assert 0.0 <= accuracy <= 1.0
        # The same window again: its loss went down.
        assert trainer.step(window[:-1], window[1:])[0] < first
        trainer.save(tmp_path / "trained.gguf")
    write_adapted(draft, tmp_path / "trained.gguf", tmp_path / "a.gguf", names)
    base, adapted = GGUFFile(read_info(draft)), GGUFFile(read_info(tmp_path / "a.gguf"))
    for t in base.info.tensors:
        same = base.data(t).tobytes() == adapted.data(adapted.tensor(t.name)).tobytes()
        assert same == (t.name not in names), t.name
    logits = []
    for path in (draft, tmp_path / "a.gguf"):
        with quiet_backend(ModelConfig(path=str(path), n_ctx=256, n_threads=1)) as be:
            logits.append(be.decode(window[:32], 0, [31])[-1])
    assert not np.allclose(logits[0], logits[1])


def test_the_optimizer_and_its_parameters_reach_llama_cpp(tmp_path):
    """SGD trains; AdamW with a huge eps (its step is lr * m / (sqrt(v) + eps)) barely moves."""
    _, draft = embedded_pair()

    def norm_only(name: str) -> bool:
        return name == "output_norm.weight"

    write_trainable(draft, tmp_path / "t.gguf", norm_only)
    window = [int(t) for t in np.random.default_rng(1).integers(1000, 20000, 257)]
    drops = {}
    for name, kw in {"sgd": dict(optimizer=SGD), "adamw": {}, "adamw eps 1e6": dict(eps=1e6)}.items():
        with Trainer(tmp_path / "t.gguf", 256, norm_only, 1e-3, threads=1, **kw) as trainer:
            first = trainer.step(window[:-1], window[1:])[0]
            drops[name] = first - trainer.step(window[:-1], window[1:])[0]
    assert drops["sgd"] > 0 and drops["adamw"] > 0
    assert abs(drops["adamw eps 1e6"]) < drops["adamw"] / 100



def test_a_window_llama_cpp_would_pad_is_refused_not_aborted(tmp_path):
    """llama.cpp pads a 128-token context to 256 and its trainer then reads 256-token windows
    from a dataset of 128-token ones (a GGML_ASSERT that ends the process): refused instead."""
    _, draft = embedded_pair()
    chosen = trains("head", read_info(draft).n_layer)
    write_trainable(draft, tmp_path / "t.gguf", chosen)
    with pytest.raises(ValueError, match="pads a 128-token context to 256"):
        Trainer(tmp_path / "t.gguf", 128, chosen, 1e-3, threads=1)

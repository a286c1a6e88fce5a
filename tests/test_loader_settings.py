"""The loader's settings in the Models tab (app/runtime/loader_settings.py, app/ui/wizard.py):
GPU layers, context length, flash attention and KV cache type by the CLI's and /v1/models'
names; the plan follows them before anything loads, and a setting that does not fit is
refused with the plan's one-line reason. Made-up devices, fake backends."""
from __future__ import annotations

import pytest

from app.cli import build_parser
from app.runtime.holder import PairHolder
from app.runtime.loader_settings import NAMES, LoaderSettings, option
from app.serve.server import create_app
from app.ui import wizard
from fastapi.testclient import TestClient
from bench.fakes.backend import FakeBackend
from engine.backend import ModelConfig
from engine.errors import SettingsError
from models.machine import Machine
from tests import tinygguf
from tests.serve_fakes import API_KEY, AUTH, serve_access

GIB = 1 << 30


def card(gib: float) -> Machine:
    return Machine(64 * GIB, 60 * GIB, f"Test GPU {gib:g} GiB", int(gib * GIB), int(gib * GIB))


@pytest.fixture
def files(tmp_path, monkeypatch):
    t = tinygguf.write(tmp_path / "t.gguf", n_layer=8, n_embd=64, n_head=8, n_head_kv=2,
                       tokens=tinygguf.vocab(64))
    d = tinygguf.write(tmp_path / "d.gguf", n_layer=2, n_embd=32, n_head=4, n_head_kv=2,
                       tokens=tinygguf.vocab(64))
    monkeypatch.setattr("loading.devices.detect", lambda: card(3))
    return str(t), str(d)


def _plan(files, **settings) -> str:
    s = {"n_ctx": 256} | settings
    return wizard.plan_html("", files[0], "", files[1], **s)


def test_the_names_are_the_command_lines():
    args = vars(build_parser().parse_args(["generate", "--prompt", "x"]))
    for name in NAMES:
        assert name in args and option(name) == "--" + name.replace("_", "-")
    # The defaults are the command line's.
    defaults = LoaderSettings()
    assert (defaults.ctx, defaults.flash_attn, defaults.kv_type) == (
        args["ctx"], args["flash_attn"], args["kv_type"])
    assert defaults.layers() == (args["gpu_layers"], args["draft_gpu_layers"])


def test_the_plan_follows_the_settings_before_anything_loads(files):
    assert "target 8/8 layers on Test GPU 3 GiB" in _plan(files)
    # -ngl 3: the output matrix and two blocks.
    assert "target 2/8 layers" in _plan(files, gpu_layers="3")
    assert "draft 0/2 layers" in _plan(files, draft_gpu_layers="0")
    assert "target 8/8" in _plan(files, gpu_layers="all")
    f16 = LoaderSettings(ctx=4096).plan(*map_paths(files), machine=card(3))[1]
    q4 = LoaderSettings(ctx=4096, kv_type="q4_0").plan(*map_paths(files), machine=card(3))[1]
    assert q4.placement("target").kv * 3 < f16.placement("target").kv
    off = LoaderSettings(ctx=4096, flash_attn="off").plan(*map_paths(files), machine=card(3))[1]
    assert off.placement("target").compute > f16.placement("target").compute


def map_paths(files):
    from pathlib import Path
    return Path(files[0]), Path(files[1])


def test_a_setting_that_does_not_fit_gets_the_plans_one_line_reason(files, monkeypatch):
    # A card with no room past its margin: every layer asked for does not fit as set.
    monkeypatch.setattr("loading.devices.detect", lambda: card(1.0))
    note = _plan(files, gpu_layers="all", draft_gpu_layers="all")
    assert "Does not fit as set" in note and "--gpu-layers 0" in note
    assert "\n" not in note
    assert "Refused" in _plan(files, gpu_layers="many") and "--gpu-layers takes" in _plan(
        files, gpu_layers="many")
    assert "needs flash attention" in _plan(files, flash_attn="off", kv_type="q8_0")


def test_loading_refuses_a_setting_that_does_not_fit_before_anything_loads(files, monkeypatch):
    monkeypatch.setattr("loading.devices.detect", lambda: card(1.0))
    loaded: list[ModelConfig] = []
    holder = PairHolder(loader=lambda c: loaded.append(c) or FakeBackend(eog=59),
                        history_tokens=None)
    notes = list(wizard.load_pair(holder, "", files[0], "", files[1], 256,
                                  settings=LoaderSettings("all", "all")))
    assert len(notes) == 1 and "Refused" in notes[0] and "--gpu-layers 0" in notes[0]
    assert loaded == []


def test_the_settings_reach_the_load_and_the_api(files):
    loaded: list[ModelConfig] = []
    holder = PairHolder(loader=lambda c: loaded.append(c) or FakeBackend(eog=59),
                        history_tokens=None)
    chosen = LoaderSettings("3", "auto", 512, "on", "q8_0")
    notes = list(wizard.load_pair(holder, "", files[0], "", files[1], 512, settings=chosen))
    assert "Loaded" in notes[-1]
    assert [(c.n_gpu_layers, c.n_ctx, c.flash_attn, c.kv_type) for c in loaded] == [
        (3, 512, "on", "q8_0"), (3, 512, "on", "q8_0")]
    # /v1/models reports them by the same names, GPU layers as asked.
    app = create_app(holder, holder.queue, serve_access(API_KEY))
    models = TestClient(app, headers=AUTH).get("/v1/models").json()["data"][0]
    assert models["settings"] == {"gpu_layers": "3", "draft_gpu_layers": "auto", "ctx": 512,
                                  "flash_attn": "on", "kv_type": "q8_0"}
    assert set(models["settings"]) == set(NAMES)
    holder.close()


def test_bad_gpu_layers_text_names_the_option():
    with pytest.raises(SettingsError, match="--draft-gpu-layers takes auto, all or a number"):
        LoaderSettings(draft_gpu_layers="most").layers()

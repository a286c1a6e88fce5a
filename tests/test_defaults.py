"""The CLI, the app and the API start from the same settings: one home for what users see
(app/runtime/defaults.py)."""
from __future__ import annotations

import gradio as gr

from app.cli import build_parser
from app.runtime.defaults import DEFAULT_GAMMA, DEFAULT_MAX_TOKENS, DEFAULT_POLICY, PLAIN
from app.serve.parsing import parse_chat
from app.settings import generation_config, policy_name
from app.ui import controls


def test_the_cli_the_app_and_the_api_start_from_the_same_defaults():
    args = build_parser().parse_args(["generate", "--prompt", "x", "--target", "t.gguf"])
    cli = generation_config(args)
    api = parse_chat({"messages": [{"role": "user", "content": "x"}]}, ["hybrid", PLAIN],
                     "hybrid")
    with gr.Blocks():
        widgets = controls.build(["hybrid", PLAIN], "hybrid", "t")
    app = controls.Settings.from_values(*[w.value for w in widgets])
    assert policy_name(args) == api.policy == app.policy == DEFAULT_POLICY == "adaptive"
    # The adaptive policy's maximum gamma, which the app's slider once started at 4.
    assert cli.gamma == api.config.gamma == app.gamma == DEFAULT_GAMMA["adaptive"] == 8
    assert cli.max_tokens == api.config.max_tokens == app.max_tokens == DEFAULT_MAX_TOKENS
    assert cli.params == api.config.params == app.config().params

"""The CLI, the app and the API start from the same settings: one home for what users see
(app/runtime/defaults.py, app/runtime/ranges.py)."""
from __future__ import annotations

import gradio as gr

from app.cli import build_parser
from app.runtime.defaults import DEFAULT_GAMMA, DEFAULT_MAX_TOKENS, DEFAULT_POLICY, PLAIN
from app.runtime.request import Offer
from app.serve.parsing import parse_chat
from app.settings import request_spec
from app.ui import controls

OFFER = Offer(("hybrid", PLAIN), "hybrid")


def test_the_cli_the_app_and_the_api_start_from_the_same_defaults():
    args = build_parser().parse_args(["generate", "--prompt", "x", "--target", "t.gguf"])
    cli = request_spec(args)
    api = parse_chat({"messages": [{"role": "user", "content": "x"}]}, OFFER).spec
    with gr.Blocks():
        widgets = controls.build(list(OFFER.drafters), OFFER.drafter, "t")
    app = controls.spec(OFFER, *[w.value for w in widgets])
    assert cli.policy == api.policy == app.policy == DEFAULT_POLICY == "adaptive"
    # The adaptive policy's maximum gamma, which the app's slider once started at 4.
    assert cli.gamma == api.gamma == app.gamma == DEFAULT_GAMMA["adaptive"] == 8
    assert cli.max_tokens == api.max_tokens == app.max_tokens == DEFAULT_MAX_TOKENS
    assert cli.sampling == api.sampling == app.sampling
    assert cli.drafter == api.drafter == app.drafter == "hybrid"
    assert cli.seed == api.seed == app.seed == -1

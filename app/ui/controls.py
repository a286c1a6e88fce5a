"""The generation settings shared by the chat and side-by-side tabs, and the page's translation
of their values into the request spec (app/runtime/request.py) the CLI and the API make too.

Drafters come from the loaded pair; gamma policies, every default and every range from
app/runtime/defaults.py and app/runtime/ranges.py, as the CLI's and the API's do.
"""
from __future__ import annotations

import gradio as gr

from app.runtime.defaults import DEFAULT_GAMMA, DEFAULT_POLICY, HISTORY, PLAIN, POLICIES, plain_alias
from app.runtime.ranges import BY_NAME, RANDOM_SEED
from app.runtime.request import Offer, RunSpec, resolve
from app.runtime.structured import OFF, OUTPUT_CHOICES, SCHEMA, output_spec
from engine.pair import Prompt

# The settings widgets, in the order `build` returns them and `spec` takes their values.
WIDGETS = ("drafter", "policy", "gamma", "temperature", "top_k", "top_p", "min_p", "seed",
           "max_tokens")


def policy_names() -> list[str]:
    return list(POLICIES)


def spec(offer: Offer, drafter: str | None, policy: str | None, gamma: float | None,
         temperature: float | None, top_k: float | None, top_p: float | None,
         min_p: float | None, seed: float | str | None, max_tokens: float | None,
         history: bool = HISTORY, prompt: Prompt = "", raw: bool = False,
         output: str | None = OFF, schema: str | None = "",
         prediction: str | None = "") -> RunSpec:
    """The page's RunSpec. The policy and gamma controls steer a speculative drafter only: with
    drafter plain the page gives neither. An empty seed box is -1, a random seed. `output` and
    `schema`: the structured-output choice and the schema box (app/runtime/structured.py),
    checked first, as the command line reads its schema file before its other settings.
    `prediction`: the "predicted output" box (empty: none)."""
    grammar = output_spec(output, schema)
    given = dict(zip(WIDGETS, (drafter, policy, gamma, temperature, top_k, top_p, min_p, seed,
                               max_tokens)))
    if isinstance(drafter, str) and plain_alias(drafter) == PLAIN:
        given["policy"] = given["gamma"] = None
    if isinstance(seed, str) and not seed.strip():
        given["seed"] = RANDOM_SEED
    return resolve({**given, "history": history, "prediction": prediction or None}, offer, prompt,
                   raw, grammar=grammar)


def build(drafters: list[str], default_drafter: str, prefix: str, compare: bool = False) -> list[gr.components.Component]:
    """The settings widgets in `WIDGETS` order. In the side-by-side tab the
    plain run is always plain decoding, so it is not offered as the speculative drafter."""
    choices = [d for d in drafters if d != PLAIN] if compare else drafters
    default = default_drafter if default_drafter in choices else (choices[0] if choices else None)
    def eid(name: str) -> str:
        return f"{prefix}-{name}"

    with gr.Row():
        drafter = gr.Dropdown(choices=choices, value=default, label="drafter", elem_id=eid("drafter"),
                              info=f"who proposes tokens; '{PLAIN}' is plain decoding",
                              allow_custom_value=True)
        policies = policy_names()
        policy = gr.Dropdown(choices=policies, value=DEFAULT_POLICY,
                             label="gamma policy", elem_id=eid("policy"),
                             info="how many tokens to draft each round; 'plain' never drafts "
                                  "(a control: what the speculative path costs by itself)")
        row = BY_NAME["gamma"]
        gamma = gr.Slider(row.low if not compare else 1, row.high,
                          value=DEFAULT_GAMMA[DEFAULT_POLICY], step=1, label="gamma",
                          elem_id=eid("gamma"), info="tokens drafted per round: fixed value, "
                          "heuristic start, adaptive maximum" + ("" if compare else
                                                                 f"; {row.meaning}"))
        # Each policy the user picks starts from its own default gamma, as on the command line
        # and in the API (`input`: the pairing record's policy and gamma are set together).
        policy.input(lambda p: gr.update(value=DEFAULT_GAMMA.get(p, DEFAULT_GAMMA[DEFAULT_POLICY])),
                      policy, gamma, queue=False, api_visibility="private")
    with gr.Row():
        # The sliders' ends are the page's choice; the ranges are the table's.
        temperature = gr.Slider(0.0, 2.0, value=_default("temperature"), step=0.05,
                                label="temperature", info=_info("temperature"),
                                elem_id=eid("temperature"))
        top_k = gr.Slider(0, 200, value=_default("top_k"), step=1, label="top-k",
                          info=_info("top_k"), elem_id=eid("top-k"))
        top_p = gr.Slider(0.01, 1.0, value=_default("top_p"), step=0.01, label="top-p",
                          info=_info("top_p"), elem_id=eid("top-p"))
        min_p = gr.Slider(0.0, 0.99, value=_default("min_p"), step=0.01, label="min-p",
                          info=_info("min_p"), elem_id=eid("min-p"))
    with gr.Row():
        seed = gr.Number(value=_default("seed"), precision=0, label="seed", info=_info("seed"),
                         elem_id=eid("seed"))
        max_tokens = gr.Slider(1, 2048, value=_default("max_tokens"), step=1, label="max tokens",
                               elem_id=eid("max-tokens"))
    return [drafter, policy, gamma, temperature, top_k, top_p, min_p, seed, max_tokens]


def build_output(prefix: str) -> list[gr.components.Component]:
    """The structured-output widgets, the choice then the box (`spec`'s `output` and `schema`):
    off, any JSON object, or the JSON schema in the box (typing one there turns it on). A
    schema that is not JSON, or that the constraint engine refuses, is refused when a
    generation starts, with its message."""
    output = gr.Radio(list(OUTPUT_CHOICES), value=OFF, label="structured output",
                      elem_id=f"{prefix}-output",
                      info="the answer follows the schema; tokens it allows alone are forced: "
                           "committed without asking a model")
    schema = gr.Code(value="", language="json", label="JSON schema", lines=5, interactive=True,
                     elem_id=f"{prefix}-schema")
    schema.input(lambda text, choice: gr.update(value=SCHEMA) if (text or "").strip() and
                 choice == OFF else gr.update(), [schema, output], output, queue=False,
                 api_visibility="private")
    return [output, schema]


def build_prediction(prefix: str) -> gr.Textbox:
    """The "predicted output" box (`spec`'s `prediction`): the answer expected, a file pasted to
    be edited, which a speculating drafter copies from first wherever the answer follows it;
    kept for the requests after, until cleared."""
    return gr.Textbox(value="", label="predicted output", lines=3, max_lines=12,
                      elem_id=f"{prefix}-prediction",
                      placeholder="the answer you expect, e.g. the file you ask to have edited",
                      info="drafted from first wherever the answer follows it; verified like "
                           "any draft, so the answer is the model's own")


def _default(name: str):
    return BY_NAME[name].default


def _info(name: str) -> str:
    return BY_NAME[name].meaning

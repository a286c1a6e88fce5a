"""The generation settings shared by the chat and side-by-side tabs, and their conversion into
the engine's GenerationConfig, drafter name and gamma policy.

Drafters come from the loaded pair; gamma policies, and every default, from
app/runtime/defaults.py, as the CLI's and the API's do.
"""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from app.runtime.defaults import (DEFAULT_GAMMA, DEFAULT_MAX_TOKENS, DEFAULT_POLICY, PLAIN,
                                  POLICIES, SAMPLING)
from engine.errors import SettingsError
from engine.generation_config import MAX_GAMMA, GenerationConfig
from engine.control.registry import make_policy
from engine.control.policy import GammaPolicy
from engine.sampling import SamplingParams


def policy_names() -> list[str]:
    return list(POLICIES)


@dataclass(frozen=True)
class Settings:
    drafter: str
    policy: str
    gamma: int
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int | None
    max_tokens: int

    @classmethod
    def from_values(cls, drafter: str, policy: str, gamma: float, temperature: float, top_k: float,
                    top_p: float, min_p: float, seed: float | str | None, max_tokens: float) -> "Settings":
        seed_value: int | None
        if seed is None or (isinstance(seed, str) and not seed.strip()) or (not isinstance(seed, str) and seed < 0):
            seed_value = None
        else:
            try:
                seed_value = int(seed)
            except ValueError:
                raise SettingsError(f"seed must be an integer, got {seed!r}") from None
        return cls(drafter=drafter or PLAIN, policy=policy or DEFAULT_POLICY, gamma=int(gamma),
                   temperature=float(temperature), top_k=int(top_k), top_p=float(top_p),
                   min_p=float(min_p), seed=seed_value, max_tokens=int(max_tokens))

    def config(self, gamma: int | None = None) -> GenerationConfig:
        params = SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                                min_p=self.min_p, seed=self.seed)
        return GenerationConfig(params=params, gamma=self.gamma if gamma is None else gamma,
                                max_tokens=self.max_tokens)

    def policy_for(self, drafter: str) -> GammaPolicy | None:
        return None if drafter == PLAIN else make_policy(self.policy, self.gamma)


def build(drafters: list[str], default_drafter: str, prefix: str, compare: bool = False) -> list[gr.components.Component]:
    """The settings widgets in `Settings.from_values` order. In the side-by-side tab the
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
        gamma = gr.Slider(0 if not compare else 1, MAX_GAMMA, value=DEFAULT_GAMMA[DEFAULT_POLICY],
                          step=1, label="gamma", elem_id=eid("gamma"),
                          info="tokens drafted per round: fixed value, heuristic start, adaptive maximum")
        # Each policy starts from its own default gamma, as on the command line and in the API.
        policy.change(lambda p: gr.update(value=DEFAULT_GAMMA.get(p, DEFAULT_GAMMA[DEFAULT_POLICY])),
                      policy, gamma, queue=False, api_visibility="private")
    with gr.Row():
        temperature = gr.Slider(0.0, 2.0, value=SAMPLING.temperature, step=0.05, label="temperature",
                                info="0 is greedy", elem_id=eid("temperature"))
        top_k = gr.Slider(0, 200, value=SAMPLING.top_k, step=1, label="top-k", info="0 is off",
                          elem_id=eid("top-k"))
        top_p = gr.Slider(0.01, 1.0, value=SAMPLING.top_p, step=0.01, label="top-p", elem_id=eid("top-p"))
        min_p = gr.Slider(0.0, 0.99, value=SAMPLING.min_p, step=0.01, label="min-p", elem_id=eid("min-p"))
    with gr.Row():
        seed = gr.Number(value=-1, precision=0, label="seed", info="-1 is random", elem_id=eid("seed"))
        max_tokens = gr.Slider(1, 2048, value=DEFAULT_MAX_TOKENS, step=1, label="max tokens",
                               elem_id=eid("max-tokens"))
    return [drafter, policy, gamma, temperature, top_k, top_p, min_p, seed, max_tokens]

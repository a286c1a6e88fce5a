"""One request, whichever front end it came from. `resolve` turns the settings a user gave (by
their names in app/runtime/ranges.py; absent or None is "not given") into a `RunSpec`, against
what the loaded pair offers (`Offer`: its drafters, its default drafter, its context and the
pairing record's choice). `tandem generate`, the page and the API translate their inputs into
`resolve`'s mapping and nothing else, so the same settings make the same RunSpec, or the same
error, in all three; the spec then builds the engine's settings and the one gamma policy."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from app.runtime.defaults import DEFAULT_GAMMA, DEFAULT_POLICY, HISTORY, PLAIN, POLICIES, plain_alias
from app.runtime.ranges import BY_NAME, RANDOM_SEED, SETTINGS, SPECULATION, SpecError
from engine.control.policy import GammaPolicy
from engine.control.registry import make_policy
from engine.generation_config import GenerationConfig
from engine.grammar.spec import GrammarSpec
from engine.pair import Pair, Prompt
from engine.sampling import SamplingParams


@dataclass(frozen=True)
class Offer:
    """What a request may choose from: the pair's drafters and default drafter, the context
    every loaded model holds (None before loading: no bound on the answer's length), and the
    pairing record's choice of drafter, policy and gamma (app/runtime/tuned.py)."""
    drafters: tuple[str, ...]
    default_drafter: str
    n_ctx: int | None = None
    tuned: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, pair: Pair, tuned: Mapping[str, Any] | None = None) -> "Offer":
        return cls(tuple(pair.drafters), pair.default_drafter, pair.n_ctx, dict(tuned or {}))

    @property
    def drafter(self) -> str:
        """The drafter a request that names none gets: the record's, else the pair's."""
        chosen = self.tuned.get("drafter")
        return chosen if chosen in self.drafters else self.default_drafter


@dataclass(frozen=True)
class RunSpec:
    """Everything one generation runs with. `policy` is None and `gamma` 0 for plain decoding."""
    drafter: str
    policy: str | None
    gamma: int
    sampling: SamplingParams
    max_tokens: int
    stop: tuple[str, ...] = ()
    history: bool = HISTORY
    # Chat messages, or a text (with the chat template unless `raw`).
    prompt: Prompt = ""
    raw: bool = False
    # What the answer must follow (a JSON schema, a grammar, the tool-call syntax); None: free.
    grammar: GrammarSpec | None = None
    # Each token's log probability with this many alternatives; None: none.
    logprobs: int | None = None
    # Tools the chat template describes to the model (OpenAI's `tools` entries); empty: none.
    tools: tuple[dict, ...] = ()
    # Makes each generation's rule that ends the answer early (GenerationConfig.until: a
    # repeated tool call); None: none.
    until: Callable[[], Callable[[str], bool]] | None = field(default=None, compare=False)
    # The answer expected (OpenAI's predicted output: a file to be edited), drafted from first
    # by a speculating drafter (engine/drafters/prediction.py); plain decoding has nothing to
    # draft and decodes as without it. Empty: none.
    prediction: str = ""

    @property
    def seed(self) -> int:
        return RANDOM_SEED if self.sampling.seed is None else self.sampling.seed

    @property
    def config(self) -> GenerationConfig:
        return GenerationConfig(params=self.sampling, gamma=self.gamma,
                                max_tokens=self.max_tokens, stop=self.stop,
                                logprobs=self.logprobs,
                                until=self.until() if self.until is not None else None)

    def make_policy(self) -> GammaPolicy | None:
        """The one way a request's gamma policy is built (engine/control/registry.py), fresh for
        each generation; the pair calibrates it under its lock as the generation starts."""
        return None if self.policy is None else make_policy(self.policy, self.gamma)

    def plain(self) -> "RunSpec":
        """The same request decoded plainly (the side-by-side tab's other run)."""
        return replace(self, drafter=PLAIN, policy=None, gamma=0)


def resolve(given: Mapping[str, Any], offer: Offer, prompt: Prompt = "",
            raw: bool = False, grammar: GrammarSpec | None = None,
            tools: tuple[dict, ...] = ()) -> RunSpec:
    """The RunSpec of the settings `given`, or the SpecError of the first bad one (in the
    table's order). The pairing record's choice applies when no speculation setting is given.
    `grammar`: what the answer must follow, as the front end read it (a schema, a grammar);
    `tools`: what the chat template describes to the model (app/runtime/tool_calls.py)."""
    given = {k: v for k, v in given.items() if v is not None}
    unknown = sorted(set(given) - BY_NAME.keys())
    if unknown:
        raise ValueError(f"not a request setting: {unknown[0]}")
    if offer.tuned.get("drafter") in offer.drafters and not any(k in given for k in SPECULATION):
        given = {**offer.tuned, **given}
    if isinstance(given.get("drafter"), str):
        given["drafter"] = plain_alias(given["drafter"])
    bounds: dict[str, dict] = {"drafter": {"choices": offer.drafters},
                               "policy": {"choices": POLICIES},
                               "max_tokens": {"high": offer.n_ctx}}
    v = {s.name: s.check(given[s.name], **bounds.get(s.name, {})) if s.name in given
         else s.default for s in SETTINGS}
    drafter, policy, gamma = _speculation(given, v, offer)
    sampling = SamplingParams(temperature=v["temperature"], top_k=v["top_k"], top_p=v["top_p"],
                              min_p=v["min_p"], seed=None if v["seed"] == RANDOM_SEED else v["seed"])
    return RunSpec(drafter=drafter, policy=policy, gamma=gamma, sampling=sampling,
                   max_tokens=v["max_tokens"], stop=v["stop"], history=v["history"],
                   prompt=prompt, raw=raw, grammar=grammar, logprobs=v["top_logprobs"],
                   tools=tools, prediction=v["prediction"])


def _speculation(given: Mapping[str, Any], v: Mapping[str, Any],
                 offer: Offer) -> tuple[str, str | None, int]:
    """(drafter, policy, gamma): gamma 0 is plain decoding whatever the drafter; with drafter
    plain, a policy or a gamma above 0 would have no effect and is refused."""
    drafter = v["drafter"] or offer.default_drafter
    if drafter == PLAIN:
        for name in ("policy", "gamma"):
            if name in given and v[name] != 0:
                raise SpecError(name, f"{name} has no effect with drafter {PLAIN} (plain "
                                "decoding); drop it")
    if drafter == PLAIN or v["gamma"] == 0:
        return PLAIN, None, 0
    policy = v["policy"] or DEFAULT_POLICY
    return drafter, policy, DEFAULT_GAMMA[policy] if v["gamma"] is None else v["gamma"]

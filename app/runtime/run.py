"""Running a RunSpec on the loaded pair: the prompt is tokenized and its fit checked once, by the
engine's rule (the smallest context of the loaded models, `Pair.prompt_tokens`), and those
tokens are what the generation decodes, with the spec's policy, its grammar compiled for the
target (`Pair.compile_grammar`, which a front end calls first to refuse a bad one) and the
caller's history; a prediction (the answer expected) is tokenized once too, and refused when the
context cannot hold it after the prompt."""
from __future__ import annotations

from dataclasses import replace
from typing import Generator, Sequence

from app.runtime.ranges import SpecError
from app.runtime.request import RunSpec
from engine.drafters.history_index import HistoryIndex
from engine.events import Event
from engine.pair import Pair


def prompt_tokens(pair: Pair, spec: RunSpec) -> list[int]:
    """The spec's prompt as tokens; PromptTooLongError when the context cannot hold it and the
    answer's first token."""
    return pair.prompt_tokens(spec.prompt, raw=spec.raw, tools=spec.tools or None)


def prediction_tokens(pair: Pair, spec: RunSpec, n_prompt: int) -> list[int]:
    """The spec's prediction as tokens (none without one); the `prediction` setting's SpecError
    when the context cannot hold them after the prompt's `n_prompt` tokens (an answer that long
    could never be written)."""
    tokens = pair.prediction_tokens(spec.prediction)
    if n_prompt + len(tokens) > pair.n_ctx:
        raise SpecError("prediction", f"prediction is {len(tokens)} tokens, and after the "
                        f"prompt's {n_prompt} the context holds {max(pair.n_ctx - n_prompt, 0)}; "
                        "shorten it or raise --ctx")
    return tokens


def generate(pair: Pair, spec: RunSpec, tokens: Sequence[int] | None = None,
             history: HistoryIndex | None = None,
             prediction: Sequence[int] | None = None) -> Generator[Event, None, None]:
    """The spec's generation; `tokens` from `prompt_tokens` and `prediction` from
    `prediction_tokens` when the caller needed them first (else they are counted here, before
    the first event is asked for). `history` is used only when the spec asks for it."""
    tokens = prompt_tokens(pair, spec) if tokens is None else tokens
    if prediction is None:
        prediction = prediction_tokens(pair, spec, len(tokens))
    return _events(pair, spec, tokens, history if spec.history else None, prediction)


def _events(pair: Pair, spec: RunSpec, tokens: Sequence[int], history: HistoryIndex | None,
            prediction: Sequence[int]) -> Generator[Event, None, None]:
    config = spec.config
    if spec.grammar is not None:
        config = replace(config, grammar=pair.compile_grammar(spec.grammar))
    yield from pair.generate_tokens(tokens, config, drafter=spec.drafter,
                                    policy=spec.make_policy(), history=history,
                                    prediction=prediction)

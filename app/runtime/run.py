"""Running a RunSpec on the loaded pair: the prompt is tokenized and its fit checked once, by the
engine's rule (the smallest context of the loaded models, `Pair.prompt_tokens`), and those
tokens are what the generation decodes, with the spec's policy, its grammar compiled for the
target (`Pair.compile_grammar`, which a front end calls first to refuse a bad one) and the
caller's history."""
from __future__ import annotations

from dataclasses import replace
from typing import Generator, Sequence

from app.runtime.request import RunSpec
from engine.drafters.history_index import HistoryIndex
from engine.events import Event
from engine.pair import Pair


def prompt_tokens(pair: Pair, spec: RunSpec) -> list[int]:
    """The spec's prompt as tokens; PromptTooLongError when the context cannot hold it and the
    answer's first token."""
    return pair.prompt_tokens(spec.prompt, raw=spec.raw, tools=spec.tools or None)


def generate(pair: Pair, spec: RunSpec, tokens: Sequence[int] | None = None,
             history: HistoryIndex | None = None) -> Generator[Event, None, None]:
    """The spec's generation; `tokens` from `prompt_tokens` when the caller needed them first
    (else they are counted here, before the first event is asked for). `history` is used only
    when the spec asks for it."""
    tokens = prompt_tokens(pair, spec) if tokens is None else tokens
    return _events(pair, spec, tokens, history if spec.history else None)


def _events(pair: Pair, spec: RunSpec, tokens: Sequence[int],
            history: HistoryIndex | None) -> Generator[Event, None, None]:
    config = spec.config
    if spec.grammar is not None:
        config = replace(config, grammar=pair.compile_grammar(spec.grammar))
    yield from pair.generate_tokens(tokens, config, drafter=spec.drafter,
                                    policy=spec.make_policy(), history=history)

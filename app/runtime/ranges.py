"""The one table of request settings: each row names a setting, its kind, its range, its default
and what its special values mean, and how each front end spells it (the CLI's option, the API's
field). `tandem generate`, the page and the API check every value against this table, so the
same value gets the same answer, and a bad one the same one-line message, from all three.

The meanings are those users of llama.cpp, LM Studio and Ollama expect: temperature 0 is
greedy, top-k 0 and top-p 1 and min-p 0 are off, seed -1 is a random seed. Gamma is the most
tokens drafted per round, so gamma 0 drafts nothing: plain decoding, whatever the drafter
(llama.cpp's --draft-max 0). A new setting (issue 37's response_format, tools, logprobs) is one
more row here and one more field of the RunSpec (app/runtime/request.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from app.runtime.defaults import DEFAULT_MAX_TOKENS, HISTORY, SAMPLING
from engine.errors import SettingsError
from engine.generation_config import MAX_GAMMA
from engine.logprobs import MAX_TOP

NUMBER, INTEGER, CHOICE, FLAG, TEXTS = "number", "integer", "choice", "flag", "texts"
# A predicted answer: a text (the CLI's file, the page's box), or OpenAI's predicted output,
# {"type": "content", "content": a text or a list of text parts} (the API's body).
PREDICTED = "predicted"
PREDICTION_FORM = '{"type": "content", "content": a string or a list of text parts}'

# Seed -1: a random seed, drawn for each generation (SamplingParams' None).
RANDOM_SEED = -1


class SpecError(SettingsError):
    """A request setting out of its range or contradicting another; `setting` names its row,
    which each front end spells its own way (the API's `param`)."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(message)
        self.setting = setting


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str
    # None: the default depends on other settings or on the pair (drafter, gamma).
    default: Any
    meaning: str
    low: float | None = None
    high: float | None = None
    # A bound the value may not reach: top-p > 0, min-p < 1.
    open_low: bool = False
    open_high: bool = False
    # The API's field (a path into the body); the CLI's option.
    api: str = ""
    cli: str = ""

    @property
    def api_field(self) -> str:
        return self.api or self.name

    @property
    def cli_option(self) -> str:
        return self.cli or "--" + self.name.replace("_", "-")

    def span(self, high: float | None = None) -> str:
        """The range in words: ">= 0", "in (0, 1]", "between 0 and 32"."""
        low, high = self.low, self.high if high is None else high
        if self.kind == INTEGER:
            return f">= {low:g}" if high is None else f"between {low:g} and {high:g}"
        if high is None:
            return f"{'>' if self.open_low else '>='} {low:g}"
        return (f"in {'(' if self.open_low else '['}{low:g}, {high:g}"
                f"{')' if self.open_high else ']'}")

    def error(self, what: str, value: Any) -> SpecError:
        return SpecError(self.name, f"{self.name} must be {what}, got {show(value)}")

    def check(self, value: Any, choices: Sequence[str] = (), high: float | None = None) -> Any:
        """`value` as the RunSpec holds it, or the row's SpecError; `choices` are a choice's
        names, `high` a bound the pair sets (max_tokens: the context)."""
        if self.kind == CHOICE:
            if not isinstance(value, str) or value not in choices:
                raise self.error(f"one of {', '.join(choices)}", value)
            return value
        if self.kind == FLAG:
            if not isinstance(value, bool):
                raise self.error("true or false", value)
            return value
        if self.kind == TEXTS:
            return self._texts(value)
        if self.kind == PREDICTED:
            return self._predicted(value)
        return self._number(value, high)

    def _number(self, value: Any, high: float | None) -> int | float:
        if self.kind == INTEGER and isinstance(value, float) and value.is_integer():
            value = int(value)
        wanted = int if self.kind == INTEGER else (int, float)
        if isinstance(value, bool) or not isinstance(value, wanted) or \
                (isinstance(value, float) and not math.isfinite(value)):
            raise self.error("an integer" if self.kind == INTEGER else "a number", value)
        bounds = [b for b in (self.high, high) if b is not None]
        bound = min(bounds) if bounds else None
        too_low = self.low is not None and (value <= self.low if self.open_low else value < self.low)
        too_high = bound is not None and (value >= bound if self.open_high else value > bound)
        if too_low or too_high:
            raise self.error(self.span(bound) + f" ({self.meaning})", value)
        return value if self.kind == INTEGER else float(value)

    def _texts(self, value: Any) -> tuple[str, ...]:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) and s for s in items):
            raise self.error("a non-empty string or a list of them", value)
        return tuple(items)


    def _predicted(self, value: Any) -> str:
        name = self.name
        if isinstance(value, str):
            return value
        if not isinstance(value, dict):
            raise SpecError(name, f"{name} must be {PREDICTION_FORM}, got {_short(value)}")
        if value.get("type") != "content":
            raise SpecError(name, f"{name}.type must be 'content', got {_short(value.get('type'))}")
        extra = sorted(set(value) - {"type", "content"})
        if extra:
            raise SpecError(name, f"{name} takes type and content only, got {extra[0]!r:.40}")
        content = value.get("content")
        if isinstance(content, str):
            return content
        if not isinstance(content, list) or not content or not all(
                isinstance(p, dict) and p.get("type") == "text" and set(p) == {"type", "text"}
                and isinstance(p["text"], str) for p in content):
            raise SpecError(name, f"{name}.content must be a string or a list of text parts "
                            f'({{"type": "text", "text": ...}}), got {_short(content)}')
        return "".join(p["text"] for p in content)


def _short(value: Any) -> str:
    """A value as `show` writes it, cut to a line's length (a prediction may be a whole file)."""
    text = show(value)
    return text if len(text) <= 80 else text[:77] + "..."


def show(value: Any) -> str:
    """A value in a message, the same whichever front end it came from."""
    if isinstance(value, float):
        return f"{value:g}" if math.isfinite(value) else str(value)
    return repr(value) if isinstance(value, (str, list, tuple, dict)) else str(value)


SETTINGS: tuple[Setting, ...] = (
    Setting("drafter", CHOICE, None, "who drafts; plain is plain decoding",
            api="speculative.drafter"),
    Setting("policy", CHOICE, None, "how many tokens to draft each round",
            api="speculative.policy"),
    Setting("gamma", INTEGER, None, "0 is plain decoding", low=0, high=MAX_GAMMA,
            api="speculative.gamma"),
    Setting("temperature", NUMBER, SAMPLING.temperature, "0 is greedy", low=0),
    Setting("top_k", INTEGER, SAMPLING.top_k, "0 is off", low=0),
    Setting("top_p", NUMBER, SAMPLING.top_p, "1 is off", low=0, high=1, open_low=True),
    Setting("min_p", NUMBER, SAMPLING.min_p, "0 is off", low=0, high=1, open_high=True),
    Setting("seed", INTEGER, RANDOM_SEED, "-1 is random", low=RANDOM_SEED),
    Setting("max_tokens", INTEGER, DEFAULT_MAX_TOKENS,
            "the answer's length; at most what the context holds", low=1),
    Setting("stop", TEXTS, (), "strings that end the answer"),
    Setting("top_logprobs", INTEGER, None, "each token's log probability with this many "
            "alternatives; absent is none", low=0, high=MAX_TOP, cli="--logprobs"),
    Setting("history", FLAG, HISTORY, "draft from and add to the history of past requests",
            api="speculative.history", cli="--no-history"),
    Setting("prediction", PREDICTED, "", "the answer expected (a file to be edited), drafted "
            "from first; empty is none"),
)
BY_NAME = {s.name: s for s in SETTINGS}
# The settings a pairing record chooses (app/runtime/tuned.py): any of them given keeps the
# record's choice out of the request.
SPECULATION = ("drafter", "policy", "gamma")


def parse_text(text: str | None) -> Any:
    """A command-line value as the JSON number it spells, else the text itself, so the table
    answers "2.5" on the command line as it answers 2.5 in a request body."""
    if text is None:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text

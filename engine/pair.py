"""A loaded target (and optional draft) with the generation entry point used by CLI and UI.

The pair is built from backends already loaded (loading/load.py checks the files and loads
them; tests pass fakes). llama.cpp contexts are not thread-safe, so a lock serialises
generations: a second caller waits its turn instead of corrupting the KV caches.

Drafters by name: "draft" (the draft model) and "hybrid" (prompt lookup, else the draft model)
when a draft is loaded, "lookup" and "suffix" (the longer match in the context or, when a generation is
given one, the history of past requests) always, "early-exit" once the loading step added the target's
first k layers (loading.load.add_early_exit). The default is hybrid when a draft is loaded
(plain decoding otherwise): over the benchmark suite it matched the draft model's medians with a shorter tail of
slow answers, in greedy and sampled runs, and it edits whole files at the lookup's speed
(docs/BENCHMARKS.md). Without an explicit policy a generation uses the adaptive controller,
calibrated once per drafter on first use.
"""
from __future__ import annotations

import threading
from functools import partial
from typing import Callable, Iterator, Sequence

from engine.backend import Backend
from engine.clock import Clock, wall_ms
from engine.control.costs import Calibration, calibrate
from engine.drafters.base import PLAIN, Drafter, plain_alias
from engine.drafters.draft_model import DraftModelDrafter
from engine.drafters.hybrid import HybridDrafter
from engine.drafters.history_index import HistoryIndex
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.drafters.suffix import SUFFIX, SuffixDrafter
from engine.errors import SettingsError
from engine.events import Event
from engine.generator import GenerationConfig, generate
from engine.limits import check_prompt_fits
from engine.control.registry import make_policy
from engine.control.policy import GammaPolicy
from engine.session import Session
from engine.widths import padded_width

# Model drafters stop once their run of tokens is, by their own probabilities, less likely than
# this to be right (engine/drafters/draft_model.py); 0 drafts the full gamma every round.
DEFAULT_CHAIN_MIN = 0.5

# Calibrations measure at least widths 1..9: enough to see which batch widths are worth padding to.
PAD_CALIBRATION_GAMMA = 8

# Calibration decodes this text when a cache is still empty.
CALIBRATION_TEXT = "def add(a, b):\n    return a + b\n"

Prompt = str | Sequence[dict]

# Who drafts when nobody says: prompt lookup where the text so far repeats, else the draft model.
DEFAULT_DRAFTER = "hybrid"


def calibration_plan(context: Sequence[int], widths: int, n_ctx: int) -> tuple[list[int], int]:
    """The calibration's context and widest batch for a context of `n_ctx`: all of both when
    they fit, else half the context (at least one token) and the widths the rest holds. The
    controller extrapolates costs past the widths measured (engine/control/controller.py)."""
    context = [int(t) for t in context]
    if len(context) + widths <= n_ctx:
        return context, widths
    context = context[:max(1, min(len(context), n_ctx // 2))]
    return context, max(1, min(widths, n_ctx - len(context)))


class Pair:
    def __init__(self, target: Backend, draft: Backend | None = None, p_min: float = 0.0,
                 lookup_ngram: int = 3, chain_min: float = DEFAULT_CHAIN_MIN,
                 clock: Clock = wall_ms, draft_path: str | None = None) -> None:
        if not (0.0 <= p_min < 1.0):
            raise SettingsError(f"draft p-min must be in [0, 1), got {p_min}")
        if not (0.0 <= chain_min < 1.0):
            raise SettingsError(f"draft chain-min must be in [0, 1), got {chain_min}")
        self.target = Session(target)
        self.draft_backend = draft
        # The draft file as loaded (its derived Q4_0 copy when loading requantized it).
        self.draft_path = draft_path
        self.p_min = p_min
        self.chain_min = chain_min
        self.lock = threading.Lock()
        # Times calibration and generation (a virtual clock in tests, engine/clock.py).
        self.clock = clock
        # Models only one drafter uses (early exit), by drafter name; closed with the pair.
        self._own_backends: dict[str, Backend] = {}
        self._calibrations: dict[str, Calibration] = {}
        self._drafters: dict[str, Drafter] = {}
        if draft is not None:
            model = DraftModelDrafter(draft, p_min=p_min, chain_min=chain_min)
            self._drafters["draft"] = model
            # A 1-gram match is a weaker bet than the draft model, so hybrid wants 2 or more.
            self._drafters["hybrid"] = HybridDrafter(
                PromptLookupDrafter(ngram_max=max(lookup_ngram, 2), ngram_min=2,
                                    is_eog=target.is_eog), model)
        self._drafters["lookup"] = PromptLookupDrafter(ngram_max=lookup_ngram,
                                                       is_eog=target.is_eog)
        # The longer match in the context or the history of past requests, when a generation is
        # given one.
        self._drafters[SUFFIX] = SuffixDrafter(
            PromptLookupDrafter(ngram_max=max(lookup_ngram, 2), ngram_min=2,
                                is_eog=target.is_eog), is_eog=target.is_eog)

    @property
    def drafters(self) -> list[str]:
        return [PLAIN, *self._drafters]

    @property
    def default_drafter(self) -> str:
        return DEFAULT_DRAFTER if DEFAULT_DRAFTER in self._drafters else PLAIN

    def add_drafter(self, name: str, drafter: Drafter, backend: Backend | None = None) -> None:
        """Offer `drafter` as `name`, replacing any drafter of that name. `backend` is a model
        only this drafter uses: the pair closes it with itself, or when the name is replaced."""
        with self.lock:
            old = self._own_backends.pop(name, None)
            if old is not None:
                old.close()
            if backend is not None:
                self._own_backends[name] = backend
            self._drafters[name] = drafter
            self._calibrations.pop(name, None)

    def remove_drafter(self, name: str) -> None:
        """Forget drafter `name` and its calibration, closing the model only it used."""
        with self.lock:
            old = self._own_backends.pop(name, None)
            if old is not None:
                old.close()
            self._drafters.pop(name, None)
            self._calibrations.pop(name, None)

    def drafter(self, name: str) -> Drafter | None:
        name = plain_alias(name)
        if name == PLAIN:
            return None
        if name not in self._drafters:
            raise SettingsError(f"unknown drafter {name!r}; available: {', '.join(self.drafters)}")
        return self._drafters[name]

    def _speculating(self, name: str) -> Drafter:
        """Drafter `name`, refused for plain decoding (which has no costs to measure)."""
        chosen = self.drafter(name)
        if chosen is None:
            raise SettingsError("plain decoding drafts nothing to calibrate")
        return chosen

    def tokens_for(self, prompt: Prompt, raw: bool = False) -> list[int]:
        backend = self.target.backend
        if isinstance(prompt, str):
            text = prompt if raw else backend.chat_prompt([{"role": "user", "content": prompt}])
        else:
            text = backend.chat_prompt(prompt)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            # A command line in another encoding arrives as lone surrogates.
            raise SettingsError(f"the prompt is not valid UTF-8 (character {exc.start})") from None
        tokens = backend.tokenize(text, add_special=True, parse_special=True)
        if not tokens:
            raise SettingsError("the prompt is empty")
        return tokens

    @property
    def n_ctx(self) -> int:
        """The context every loaded model can hold (the smallest of theirs)."""
        sizes = [self.target.backend.n_ctx]
        sizes += [b.n_ctx for b in (self.draft_backend, *self._own_backends.values())
                  if b is not None]
        return min(sizes)

    def prompt_tokens(self, prompt: Prompt, raw: bool = False) -> list[int]:
        """The prompt's tokens, refused when the context cannot hold them and one more."""
        tokens = self.tokens_for(prompt, raw)
        check_prompt_fits(len(tokens), self.n_ctx)
        return tokens

    def calibration(self, drafter: str, max_gamma: int) -> Calibration:
        """Measured costs for `drafter` up to `max_gamma`, cached; caches are left unchanged.
        Call with the lock held (generate does)."""
        max_gamma = max(max_gamma, PAD_CALIBRATION_GAMMA)
        cached = self._calibrations.get(drafter)
        if cached is not None and len(cached.verify_ms) >= max_gamma + 1:
            return cached
        chosen = self._speculating(drafter)
        session = chosen.session
        context, widths = calibration_plan(self.tokens_for(CALIBRATION_TEXT, raw=True),
                                           max_gamma + 1, self.n_ctx)
        if cached is not None and len(cached.verify_ms) >= widths:
            return cached
        for s in (self.target, session):
            # Calibration decodes after what a cache holds; a cache too full for it starts
            # over (the next generation re-decodes its prompt, nothing else changes).
            if s is not None and s.n_past + widths + (0 if s.n_past else len(context)) > s.backend.n_ctx:
                s.rollback(0)
        result = calibrate(self.target, session, widths - 1, context,
                           model_name=chosen.model_name, clock=self.clock,
                           copy_name=chosen.copy_name)
        self._calibrations[drafter] = result
        return result

    def make_policy(self, name: str, drafter: str, gamma: int,
                    opening: int | None = None) -> GammaPolicy:
        """A fresh policy by name; the adaptive one gets this pair's calibration for `drafter`,
        and `opening` plain opening tokens when given."""
        policy = make_policy(name, gamma, opening=opening)
        if plain_alias(drafter) != PLAIN:
            with self.lock:
                self._calibrate(policy, drafter)
        return policy

    def _calibrate(self, policy: GammaPolicy, drafter: str) -> None:
        """Hand `policy` the calibration it asks for, if any. Call with the lock held."""
        need = policy.calibration_need()
        if need is not None:
            policy.use_calibration(self.calibration(drafter, need))

    def generate(self, prompt: Prompt, config: GenerationConfig, drafter: str | None = None,
                 raw: bool = False, policy: GammaPolicy | None = None,
                 history: HistoryIndex | None = None) -> Iterator[Event]:
        """Stream events of one generation; holds the pair's lock until it ends or is closed.
        `drafter` None is the pair's default drafter.
        Without a policy, speculation uses the adaptive controller with max gamma `config.gamma`.
        Speculation pads verify and catch-up batches to the cheaper widths the drafter's
        calibration measured (engine/widths.py), whatever the policy. `history`: past prompts
        and answers to draft from (hybrid and suffix) and to add this one to when it ends."""
        yield from self.generate_tokens(self.prompt_tokens(prompt, raw), config, drafter,
                                        policy, history)

    def generate_tokens(self, tokens: Sequence[int], config: GenerationConfig,
                        drafter: str | None = None, policy: GammaPolicy | None = None,
                        history: HistoryIndex | None = None) -> Iterator[Event]:
        """`generate` for a prompt already tokenized and checked by `prompt_tokens`, so a
        front end that needs the tokens first (to refuse a long prompt before queueing it)
        tokenizes it once."""
        drafter = self.default_drafter if drafter is None else drafter
        chosen = self.drafter(drafter)
        with self.lock:
            widths = None
            if chosen is not None and config.gamma > 0:
                if policy is None:
                    policy = make_policy("adaptive", config.gamma)
                self._calibrate(policy, drafter)
                widths = self.use_widths(drafter, config.gamma)
            yield from generate(self.target, chosen, tokens, config, policy, widths=widths,
                                clock=self.clock, history=history)

    def use_widths(self, name: str, gamma: int) -> Callable[[int], int]:
        """Pad drafter `name`'s catch-up batches to the cheaper widths of its calibration, and
        return the verify batch widths to pad to likewise (engine/widths.py). Call with the
        lock held."""
        cal = self.calibration(name, gamma)
        self._speculating(name).pad_catch_up(partial(padded_width, cal.draft_ms))
        return partial(padded_width, cal.verify_ms)

    def close(self) -> None:
        self.target.backend.close()
        for backend in self._own_backends.values():
            backend.close()
        self._own_backends.clear()
        if self.draft_backend is not None:
            self.draft_backend.close()

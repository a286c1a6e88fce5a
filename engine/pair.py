"""A loaded target (and optional draft) and its generation entry point, used by the CLI, the
app and the API.

The pair is built from backends already loaded (loading/load.py checks the files and loads
them; tests pass fakes). It holds its drafters (engine/drafter_registry.py) and what it knows
of each, its calibration and its evidence (engine/knowledge.py). Without an explicit policy a
generation uses the adaptive controller, calibrated once per drafter on first use.

llama.cpp contexts are not thread-safe. A pair without slots runs one generation at a time
and takes no lock of its own: its callers take turns (app/runtime/queue.py; the command line
runs one at a time by itself). A pair with `parallel` slots (its models hold a sequence per
slot and one of their own) runs up to that many generations together, decoded in shared
batches (engine/slots.py): the app's queue admits that many at once.
"""
from __future__ import annotations

import threading
from contextlib import nullcontext
from functools import partial
from typing import Callable, ContextManager, Generator, Iterator, Sequence

from engine.backend import Backend
from engine.clock import Clock, wall_ms
from engine.control.batch import Mates
from engine.control.costs import Calibration
from engine.control.policy import GammaPolicy
from engine.control.registry import make_policy
from engine.drafter_registry import DEFAULT_DRAFTER, DrafterRegistry
from engine.drafters.base import PLAIN, Drafter, plain_alias
from engine.drafters.history_index import HistoryIndex
from engine.errors import SettingsError
from engine.events import Event
from engine.generator import generate
from engine.generation_config import GenerationConfig
from engine.grammar.llg import Grammar, compile_grammar
from engine.grammar.spec import GrammarSpec
from engine.knowledge import CALIBRATION_TEXT, Knowledge
from engine.limits import check_prompt_fits
from engine.machine_load import machine_load, no_load
from engine.session import Session
from engine.slots import Slots
from engine.widths import padded_width

# Model drafters stop once their run of tokens is, by their own probabilities, less likely than
# this to be right (engine/drafters/draft_model.py); 0 drafts the full gamma every round.
DEFAULT_CHAIN_MIN = 0.5

Prompt = str | Sequence[dict]
# Compiled grammars kept per pair (a compile reads the whole schema; agents send the same ones).
GRAMMARS_KEPT = 16

__all__ = ["DEFAULT_CHAIN_MIN", "DEFAULT_DRAFTER", "Pair", "Prompt"]


class Pair:
    def __init__(self, target: Backend, draft: Backend | None = None, p_min: float = 0.0,
                 lookup_ngram: int = 3, chain_min: float = DEFAULT_CHAIN_MIN,
                 clock: Clock = wall_ms, draft_path: str | None = None,
                 parallel: int = 1) -> None:
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
        # Times calibration and generation (a virtual clock in tests, engine/clock.py).
        self.clock = clock
        # Each drafter's calibration and evidence, handed to the policies it makes. Timings on
        # the wall clock depend on what else the machine runs, so a calibration reads how busy
        # it is (engine/machine_load.py); a virtual clock's do not.
        self.knowledge = Knowledge(load=machine_load if clock is wall_ms else no_load)
        self._grammars: dict[GrammarSpec, Grammar] = {}
        # The API compiles a request's grammar before queueing it, while another generation
        # may be compiling its own: the kept grammars are changed under this lock.
        self._grammars_lock = threading.Lock()
        self.registry = DrafterRegistry(target.is_eog, draft, p_min, chain_min, lookup_ngram,
                                        forget=self.knowledge.forget)
        # Generations decoded together (engine/slots.py), each slot with the built-in drafters
        # over its own sequence of the draft; None: one generation at a time, on sequence 0.
        self.slots = None if parallel <= 1 else Slots(
            target, draft, parallel,
            lambda d: DrafterRegistry(target.is_eog, d, p_min, chain_min, lookup_ngram))

    @property
    def parallel(self) -> int:
        """How many generations run together."""
        return 1 if self.slots is None else self.slots.n

    @property
    def drafters(self) -> list[str]:
        return self.registry.names

    @property
    def default_drafter(self) -> str:
        return self.registry.default

    def add_drafter(self, name: str, drafter: Drafter, backend: Backend | None = None,
                    per_slot: Callable[[Backend], Drafter] | None = None) -> None:
        """Offer `drafter` as `name` (DrafterRegistry.add); its calibration starts over. With
        slots, `per_slot` makes each slot's own over its sequence of `backend` (a drafter
        without one runs only where generations run one at a time)."""
        self.registry.add(name, drafter, backend)
        if self.slots is not None and backend is not None and per_slot is not None:
            self.slots.add_drafter(name, backend, per_slot)

    def remove_drafter(self, name: str) -> None:
        self.registry.remove(name)
        if self.slots is not None:
            self.slots.remove_drafter(name)

    def drafter(self, name: str) -> Drafter | None:
        return self.registry.get(name)

    def tokens_for(self, prompt: Prompt, raw: bool = False,
                   tools: Sequence[dict] | None = None) -> list[int]:
        """The prompt's tokens: a text as it is (`raw`) or as one user message, or messages,
        through the target's chat template with `tools` (OpenAI's entries) when given."""
        backend = self.target.backend
        if isinstance(prompt, str):
            text = prompt if raw else backend.chat_prompt([{"role": "user", "content": prompt}],
                                                          tools)
        else:
            text = backend.chat_prompt(prompt, tools)
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
        sizes += [b.n_ctx for b in (self.draft_backend, *self.registry.own_backends.values())
                  if b is not None]
        return min(sizes)

    def prompt_tokens(self, prompt: Prompt, raw: bool = False,
                      tools: Sequence[dict] | None = None) -> list[int]:
        """The prompt's tokens, refused when the context cannot hold them and one more."""
        tokens = self.tokens_for(prompt, raw, tools)
        check_prompt_fits(len(tokens), self.n_ctx)
        return tokens

    def prediction_tokens(self, text: str) -> list[int]:
        """A predicted answer's tokens (a client's predicted output): the text as the target
        would write it, special tokens read as text, none added."""
        if not text:
            return []
        return self.target.backend.tokenize(text, add_special=False, parse_special=False)

    def compile_grammar(self, spec: GrammarSpec) -> Grammar:
        """`spec` compiled for the target's vocabulary (GrammarError with the constraint
        engine's message when it is refused); the last few are kept, as agents resend theirs."""
        with self._grammars_lock:
            grammar = self._grammars.pop(spec, None)
        grammar = grammar or compile_grammar(spec, self.target.backend)
        with self._grammars_lock:
            self._grammars[spec] = grammar
            while len(self._grammars) > GRAMMARS_KEPT:
                del self._grammars[next(iter(self._grammars))]
        return grammar

    def calibration(self, drafter: str, max_gamma: int) -> Calibration:
        """Measured costs for `drafter` up to `max_gamma`, cached (engine/knowledge.py);
        caches are left unchanged."""
        return self.knowledge.get(
            drafter, self.registry.speculating(drafter), self.target, max_gamma, self.n_ctx,
            lambda: self.tokens_for(CALIBRATION_TEXT, raw=True), self.clock)

    def make_policy(self, name: str, drafter: str, gamma: int,
                    opening: int | None = None) -> GammaPolicy:
        """A fresh policy by name; the adaptive one gets this pair's calibration for `drafter`,
        and `opening` plain opening tokens when given."""
        policy = make_policy(name, gamma, opening=opening)
        if plain_alias(drafter) != PLAIN:
            self._calibrate(policy, drafter)
        return policy

    def _calibrate(self, policy: GammaPolicy, drafter: str) -> None:
        """Hand `policy` the calibration it asks for, if any, with the drafter's evidence."""
        need = policy.calibration_need()
        if need is not None:
            policy.use_calibration(self.calibration(drafter, need),
                                   self.knowledge.evidence_of(drafter))

    def generate(self, prompt: Prompt, config: GenerationConfig, drafter: str | None = None,
                 raw: bool = False, policy: GammaPolicy | None = None,
                 history: HistoryIndex | None = None,
                 prediction: Sequence[int] = ()) -> Iterator[Event]:
        """Stream events of one generation. `drafter` None is the pair's default drafter.
        Without a policy, speculation uses the adaptive controller with max gamma `config.gamma`.
        Speculation pads verify and catch-up batches to the cheaper widths the drafter's
        calibration measured (engine/widths.py), whatever the policy. `history`: past prompts
        and answers to draft from (hybrid and suffix) and to add this one to when it ends.
        `prediction`: the answer's expected tokens (`prediction_tokens`), drafted from first by
        any speculating drafter (engine/drafters/prediction.py)."""
        yield from self.generate_tokens(self.prompt_tokens(prompt, raw), config, drafter,
                                        policy, history, prediction)

    def generate_tokens(self, tokens: Sequence[int], config: GenerationConfig,
                        drafter: str | None = None, policy: GammaPolicy | None = None,
                        history: HistoryIndex | None = None,
                        prediction: Sequence[int] = ()) -> Iterator[Event]:
        """`generate` for a prompt already tokenized and checked by `prompt_tokens`, so a
        front end that needs the tokens first (to refuse a long prompt before queueing it)
        tokenizes it once. With slots, the generation runs on a free one, in a batch with the
        others (engine/slots.py)."""
        drafter = self.default_drafter if drafter is None else drafter
        if self.slots is None:
            return self._generate(self.target, self.registry, tokens, config, drafter, policy,
                                  history, prediction=prediction)
        step = self.slots.step
        return self.slots.stream(tokens, lambda slot: self._generate(
            slot.target, slot.registry, tokens, config, drafter, policy, history, step,
            prediction))

    def _generate(self, target: Session, registry: DrafterRegistry, tokens: Sequence[int],
                  config: GenerationConfig, drafter: str, policy: GammaPolicy | None,
                  history: HistoryIndex | None, mates: Mates | None = None,
                  prediction: Sequence[int] = ()) -> Generator[Event, None, None]:
        """One generation on `target` with `registry`'s drafter `drafter` (the pair's own, or a
        slot's, decoded in one batch with `mates`); calibration decodes on the pair's own
        sequence, alone."""
        chosen = self._drafter_in(registry, drafter)
        widths = None
        if chosen is not None and config.gamma > 0:
            if policy is None:
                policy = make_policy("adaptive", config.gamma)
            with self._alone():
                self._calibrate(policy, drafter)
                widths = self.use_widths(drafter, config.gamma)
            if registry is not self.registry:
                chosen.pad_catch_up(self._catch_up_widths(drafter, config.gamma))
        yield from generate(target, chosen, tokens, config, policy, widths=widths,
                            clock=self.clock, history=history, mates=mates,
                            prediction=prediction)

    def _drafter_in(self, registry: DrafterRegistry, name: str) -> Drafter | None:
        """Drafter `name` of `registry`; a slot has only the built-in drafters."""
        if registry is not self.registry and plain_alias(name) in self.registry.names \
                and plain_alias(name) not in registry.names:
            raise SettingsError(f"drafter {name!r} runs one generation at a time; with "
                                f"--parallel {self.parallel} choose one of "
                                f"{', '.join(registry.names)}")
        return registry.get(name)

    def _alone(self) -> ContextManager[None]:
        """The models to this caller alone (slots: no batch decodes meanwhile)."""
        return nullcontext() if self.slots is None else self.slots.step.exclusive()

    def _catch_up_widths(self, name: str, gamma: int) -> Callable[[int], int]:
        return partial(padded_width, self.calibration(name, gamma).draft_ms)

    def use_widths(self, name: str, gamma: int) -> Callable[[int], int]:
        """Pad drafter `name`'s catch-up batches to the cheaper widths of its calibration, and
        return the verify batch widths to pad to likewise (engine/widths.py)."""
        cal = self.calibration(name, gamma)
        self.registry.speculating(name).pad_catch_up(self._catch_up_widths(name, gamma))
        return partial(padded_width, cal.verify_ms)

    def close(self) -> None:
        if self.slots is not None:
            self.slots.close()
        self.target.backend.close()
        self.registry.close()
        if self.draft_backend is not None:
            self.draft_backend.close()

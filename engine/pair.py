"""A loaded target (and optional draft) with the generation entry point used by CLI and UI.

Loading checks the files, the pair's tokenizer compatibility and the memory budget before
llama.cpp touches memory. llama.cpp contexts are not thread-safe, so a lock serialises
generations: a second caller waits its turn instead of corrupting the KV caches. A heavy draft
on the CPU is loaded as its derived Q4_0 copy unless `LoadOptions.draft_quant` says "off", and
with a trimmed output vocabulary when `LoadOptions.draft_vocab` says "trim".

Drafters by name: "draft" (the draft model) and "hybrid" (prompt lookup, else the draft model)
when a draft is loaded, "lookup" always, "early-exit" once `enable_early_exit(k)` derived and
loaded the target's first k layers. The default is hybrid when a draft is loaded (plain decoding
otherwise): over the benchmark suite it matched the draft model's medians with a shorter tail of
slow answers, in greedy and sampled runs, and it edits whole files at the lookup's speed
(docs/BENCHMARKS.md). Without an explicit policy a generation uses the adaptive controller,
calibrated once per drafter on first use.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable, Iterator, Sequence

from engine.backend import Backend, ModelConfig
from engine.clock import Clock, wall_ms
from engine.controller import AdaptiveController
from engine.costs import Calibration, calibrate
from engine.drafters.base import Drafter
from engine.drafters.draft_model import DraftModelDrafter
from engine.drafters.hybrid import HybridDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.drafters.quantized import Quantizer, derive_quantized
from engine.drafters.quantized import resolve as resolve_quant
from engine.errors import SettingsError
from engine.events import Event
from engine.generator import GenerationConfig, generate
from engine.limits import check_ctx_trained, check_prompt_fits
from engine.policy import GammaPolicy, make_policy
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


@dataclass(frozen=True)
class LoadOptions:
    check_compat: bool = True
    check_budget: bool = True
    # Derive and load the early-exit drafter too (it is another llama.cpp model, so opt-in);
    # `early_exit_layers` None means three quarters of the target's layers.
    early_exit: bool = False
    early_exit_layers: int | None = None
    # The draft as loaded: "auto" requantizes a heavy draft that runs on the CPU to Q4_0
    # (engine/drafters/quantized.py), "q4_0" always, "off" uses the file as given.
    draft_quant: str = "auto"
    # "trim" loads the draft with a trimmed output vocabulary (engine/drafters/vocab_trim.py):
    # cheaper per token on a CPU, at some acceptance; "full" as given.
    draft_vocab: str = "full"


DRAFT_VOCAB_CHOICES = ("full", "trim")


def _default_loader(config: ModelConfig) -> Backend:
    from engine import llama_backend
    return llama_backend.load(config)


def calibration_plan(context: Sequence[int], widths: int, n_ctx: int) -> tuple[list[int], int]:
    """The calibration's context and widest batch for a context of `n_ctx`: all of both when
    they fit, else half the context (at least one token) and the widths the rest holds. The
    controller extrapolates costs past the widths measured (engine/controller.py)."""
    context = [int(t) for t in context]
    if len(context) + widths <= n_ctx:
        return context, widths
    context = context[:max(1, min(len(context), n_ctx // 2))]
    return context, max(1, min(widths, n_ctx - len(context)))


class Pair:
    def __init__(self, target: Backend, draft: Backend | None = None, p_min: float = 0.0,
                 lookup_ngram: int = 3, target_config: ModelConfig | None = None,
                 loader: Callable[[ModelConfig], Backend] | None = None,
                 chain_min: float = DEFAULT_CHAIN_MIN, clock: Clock = wall_ms) -> None:
        if not (0.0 <= p_min < 1.0):
            raise SettingsError(f"draft p-min must be in [0, 1), got {p_min}")
        if not (0.0 <= chain_min < 1.0):
            raise SettingsError(f"draft chain-min must be in [0, 1), got {chain_min}")
        self.target = Session(target)
        self.draft_backend = draft
        # The draft file as loaded (its derived Q4_0 copy when Pair.load requantized it).
        self.draft_path: str | None = None
        self.target_config = target_config
        self.p_min = p_min
        self.chain_min = chain_min
        self.lock = threading.Lock()
        # Times calibration and generation (a virtual clock in tests, engine/clock.py).
        self.clock = clock
        self._loader = loader or _default_loader
        self._extra_backends: list[Backend] = []
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

    @classmethod
    def load(cls, target: ModelConfig, draft: ModelConfig | None,
             options: LoadOptions = LoadOptions(),
             loader: Callable[[ModelConfig], Backend] = _default_loader, p_min: float = 0.0,
             lookup_ngram: int = 3, quantizer: Quantizer | None = None,
             chain_min: float = DEFAULT_CHAIN_MIN) -> "Pair":
        from models.gguf_info import read_info
        info = read_info(target.path)
        check_ctx_trained(target.n_ctx, info.n_ctx_train, Path(target.path).name)
        if draft is not None:
            dinfo = read_info(draft.path)
            check_ctx_trained(draft.n_ctx, dinfo.n_ctx_train, Path(draft.path).name)
            if options.check_compat:
                from models.compat import require_compatible
                require_compatible(target.path, draft.path)
        if options.draft_vocab not in DRAFT_VOCAB_CHOICES:
            raise SettingsError(f"unknown draft vocabulary {options.draft_vocab!r}; choose one "
                                f"of {', '.join(DRAFT_VOCAB_CHOICES)}")
        if options.check_budget:
            from models.budget import require_fits
            require_fits(target, draft)
        trimmed = None
        if draft is not None:
            kind = resolve_quant(options.draft_quant, draft.path, draft.n_gpu_layers)
            if kind is not None:
                draft = replace(draft, path=str(derive_quantized(draft.path, kind, quantizer)))
            if options.draft_vocab == "trim":
                from engine.drafters.vocab_trim import derive_trimmed
                trimmed = replace(draft, path=str(derive_trimmed(draft.path)))
        target_backend = loader(target)
        try:
            draft_backend = None
            if trimmed is not None:
                from engine.drafters.trimmed import load_trimmed
                inner = loader(trimmed)
                try:
                    draft_backend = load_trimmed(draft.path, trimmed.path, inner)
                except Exception:
                    inner.close()
                    raise
            elif draft is not None:
                draft_backend = loader(draft)
        except Exception:
            target_backend.close()
            raise
        try:
            pair = cls(target_backend, draft_backend, p_min=p_min, lookup_ngram=lookup_ngram,
                       target_config=target, loader=loader, chain_min=chain_min)
            pair.draft_path = (trimmed or draft).path if draft is not None else None
            if options.early_exit or options.early_exit_layers is not None:
                pair.enable_early_exit(options.early_exit_layers)
        except Exception:
            target_backend.close()
            if draft_backend is not None:
                draft_backend.close()
            raise
        return pair

    def enable_early_exit(self, layers: int | None = None) -> None:
        """Derive (or reuse) the target's first-`layers` GGUF (default: three quarters of its
        layers) and add it as drafter "early-exit"."""
        from engine.drafters.early_exit import default_layers, derive_early_exit, early_exit_drafter
        if self.target_config is None:
            raise SettingsError("early exit needs a target loaded from a file (Pair.load)")
        if layers is None:
            from models.gguf_info import read_info
            layers = default_layers(read_info(self.target_config.path).n_layer)
        path = derive_early_exit(self.target_config.path, layers)
        backend = self._loader(replace(self.target_config, path=str(path)))
        with self.lock:
            old = self._drafters.get("early-exit")
            if old is not None:
                self._extra_backends.remove(old.session.backend)
                old.session.backend.close()
            self._extra_backends.append(backend)
            self._drafters["early-exit"] = early_exit_drafter(backend, p_min=self.p_min,
                                                               chain_min=self.chain_min)
            self._calibrations.pop("early-exit", None)

    @property
    def drafters(self) -> list[str]:
        return ["none", *self._drafters]

    @property
    def default_drafter(self) -> str:
        return DEFAULT_DRAFTER if DEFAULT_DRAFTER in self._drafters else "none"

    def add_drafter(self, name: str, drafter: Drafter) -> None:
        self._drafters[name] = drafter
        self._calibrations.pop(name, None)

    def drafter(self, name: str) -> Drafter | None:
        if name == "none":
            return None
        if name not in self._drafters:
            raise SettingsError(f"unknown drafter {name!r}; available: {', '.join(self.drafters)}")
        return self._drafters[name]

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
        sizes += [b.n_ctx for b in (self.draft_backend, *self._extra_backends) if b is not None]
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
        chosen = self.drafter(drafter)
        model = chosen.model if isinstance(chosen, HybridDrafter) else chosen
        session = getattr(model, "session", None)
        session = session if isinstance(session, Session) else None
        context, widths = calibration_plan(self.tokens_for(CALIBRATION_TEXT, raw=True),
                                           max_gamma + 1, self.n_ctx)
        if cached is not None and len(cached.verify_ms) >= widths:
            return cached
        for s in (self.target, session):
            # Calibration decodes after what a cache holds; a cache too full for it starts
            # over (the next generation re-decodes its prompt, nothing else changes).
            if s is not None and s.n_past + widths + (0 if s.n_past else len(context)) > s.backend.n_ctx:
                s.rollback(0)
        copy = (chosen.lookup.name if isinstance(chosen, HybridDrafter)
                else chosen.name if isinstance(chosen, PromptLookupDrafter) else None)
        result = calibrate(self.target, session, widths - 1, context,
                           model_source=getattr(model, "name", None), clock=self.clock,
                           copy_source=copy)
        self._calibrations[drafter] = result
        return result

    def make_policy(self, name: str, drafter: str, gamma: int,
                    opening: int | None = None) -> GammaPolicy:
        """A fresh policy by name; the adaptive one gets this pair's calibration for `drafter`,
        and `opening` plain opening tokens when given."""
        policy = make_policy(name, gamma, opening=opening)
        if isinstance(policy, AdaptiveController) and drafter != "none":
            with self.lock:
                policy.use_calibration(self.calibration(drafter, gamma))
        return policy

    def generate(self, prompt: Prompt, config: GenerationConfig, drafter: str | None = None,
                 raw: bool = False, policy: GammaPolicy | None = None) -> Iterator[Event]:
        """Stream events of one generation; holds the pair's lock until it ends or is closed.
        `drafter` None is the pair's default drafter.
        Without a policy, speculation uses the adaptive controller with max gamma `config.gamma`.
        Speculation pads verify and catch-up batches to the cheaper widths the drafter's
        calibration measured (engine/widths.py), whatever the policy."""
        drafter = self.default_drafter if drafter is None else drafter
        chosen = self.drafter(drafter)
        tokens = self.prompt_tokens(prompt, raw)
        with self.lock:
            widths = None
            if chosen is not None and config.gamma > 0:
                if policy is None:
                    policy = make_policy("adaptive", config.gamma)
                if isinstance(policy, AdaptiveController) and not policy.calibrated:
                    policy.use_calibration(self.calibration(drafter, policy.max_gamma))
                widths = self.pad_widths(drafter, config.gamma)
            yield from generate(self.target, chosen, tokens, config, policy, widths=widths,
                                clock=self.clock)

    def pad_widths(self, name: str, gamma: int) -> Callable[[int], int]:
        """The verify batch widths for drafter `name` (the draft model's catch-up widths are set
        on it too), from its calibration. Call with the lock held."""
        cal = self.calibration(name, gamma)
        chosen = self.drafter(name)
        model = chosen.model if isinstance(chosen, HybridDrafter) else chosen
        if isinstance(model, DraftModelDrafter):
            model.widths = partial(padded_width, cal.draft_ms)
        return partial(padded_width, cal.verify_ms)

    def close(self) -> None:
        self.target.backend.close()
        for backend in self._extra_backends:
            backend.close()
        self._extra_backends.clear()
        if self.draft_backend is not None:
            self.draft_backend.close()

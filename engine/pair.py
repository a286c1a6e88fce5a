"""A loaded target (and optional draft) with the generation entry point used by CLI and UI.

Loading checks the files, the pair's tokenizer compatibility and the memory budget before
llama.cpp touches memory. llama.cpp contexts are not thread-safe, so a lock serialises
generations: a second caller waits its turn instead of corrupting the KV caches.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from engine.backend import Backend, ModelConfig
from engine.drafters.base import Drafter
from engine.drafters.draft_model import DraftModelDrafter
from engine.errors import SettingsError
from engine.events import Event
from engine.generator import GenerationConfig, generate
from engine.policy import FixedGamma, GammaPolicy
from engine.session import Session

Prompt = str | Sequence[dict]


@dataclass(frozen=True)
class LoadOptions:
    check_compat: bool = True
    check_budget: bool = True


def _default_loader(config: ModelConfig) -> Backend:
    from engine import llama_backend
    return llama_backend.load(config)


class Pair:
    def __init__(self, target: Backend, draft: Backend | None = None) -> None:
        self.target = Session(target)
        self.draft_backend = draft
        self.lock = threading.Lock()
        self._drafters: dict[str, Drafter] = {}
        if draft is not None:
            self._drafters["draft"] = DraftModelDrafter(draft)

    @classmethod
    def load(cls, target: ModelConfig, draft: ModelConfig | None,
             options: LoadOptions = LoadOptions(),
             loader: Callable[[ModelConfig], Backend] = _default_loader) -> "Pair":
        from models.gguf_info import read_info
        read_info(target.path)
        if draft is not None:
            read_info(draft.path)
            if options.check_compat:
                from models.compat import require_compatible
                require_compatible(target.path, draft.path)
        if options.check_budget:
            from models.budget import require_fits
            require_fits(target, draft)
        target_backend = loader(target)
        try:
            draft_backend = loader(draft) if draft is not None else None
        except Exception:
            target_backend.close()
            raise
        return cls(target_backend, draft_backend)

    @property
    def drafters(self) -> list[str]:
        return ["none", *self._drafters]

    def add_drafter(self, name: str, drafter: Drafter) -> None:
        self._drafters[name] = drafter

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
        tokens = backend.tokenize(text, add_special=True, parse_special=True)
        if not tokens:
            raise SettingsError("the prompt is empty")
        return tokens

    def generate(self, prompt: Prompt, config: GenerationConfig, drafter: str = "draft",
                 raw: bool = False, policy: GammaPolicy | None = None) -> Iterator[Event]:
        """Stream events of one generation; holds the pair's lock until it ends or is closed."""
        chosen = self.drafter(drafter)
        tokens = self.tokens_for(prompt, raw)
        with self.lock:
            yield from generate(self.target, chosen, tokens, config,
                                policy or FixedGamma(config.gamma))

    def close(self) -> None:
        self.target.backend.close()
        if self.draft_backend is not None:
            self.draft_backend.close()

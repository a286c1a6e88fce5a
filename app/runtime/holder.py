"""The hold on the loaded pair that the app, the API and `tandem serve` share: loading it in the
background with step-by-step progress, swapping it for another pair, and the failure message
shown in the page when loading fails.

Loading runs in a thread so the page comes up at once and shows progress instead of a browser
spinner; a failed load leaves the holder in the "error" state with the one-line reason, which
every tab shows instead of going dead. Swapping (and closing) takes a turn in the generation
queue first, never refused, so a pair is never closed under a running generation.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from app.runtime.open_pair import QUIET, PairRequest, open_pair
from app.runtime.tuned import PAGE, PairingRule, PairingUse
from app.runtime.defaults import HISTORY_TOKENS, REASONING_FORMAT
from app.runtime.queue import GenerationQueue
from app.runtime.request import Offer
from engine.backend import ModelConfig
from engine.errors import TandemError
from engine.pair import Pair
from loading.calibrations import CalibrationFile
from loading.options import LoadOptions
from loading.history import LOCAL, History, HistoryStore
from loading.load import Announce, Loader
from app.runtime.loader_settings import LoaderSettings
from models.offload import OffloadPlan

LOADING, READY, ERROR, EMPTY = "loading", "ready", "error", "empty"


class NotReadyError(TandemError):
    """A generation was asked for while no pair is loaded."""


@dataclass
class LoadStatus:
    state: str = EMPTY
    message: str = "no model loaded"
    steps: list[str] = field(default_factory=list)
    step: int = 0
    started: float = 0.0
    target: str = ""
    draft: str = ""
    # Why the last load failed while an earlier pair stayed loaded (and usable).
    error: str = ""

    @property
    def fraction(self) -> float:
        return self.step / len(self.steps) if self.steps else 0.0

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started if self.started else 0.0


class PairHolder:
    """Holds at most one loaded Pair; every UI callback asks it for the pair. `queue` orders
    the generations of the page and, with `tandem ui --api`, of the API too."""

    def __init__(self, pair: Pair | None = None, loader: Loader | None = None,
                 queue: GenerationQueue | None = None,
                 history_tokens: int | None = HISTORY_TOKENS,
                 announce: Announce | None = None,
                 pairing: PairingUse | None = None) -> None:
        self.queue = queue or GenerationQueue()
        if pair is not None:
            # As many generations at once as the pair has slots.
            self.queue.set_parallel(pair.parallel)
        # Where the loaded pair's layers went (models/offload.py), for the header and the API;
        # `announce` hears each load's plan too (`tandem ui` prints its line).
        self.offload: OffloadPlan | None = None
        # The loader's settings the loaded pair was asked for, by the CLI's and the API's names.
        self.settings: LoaderSettings | None = None
        self._announce = announce
        # The history of past requests for the loaded target's vocabulary (loading/history.py),
        # made at each load; `history_tokens` None turns it off (--no-history).
        self.history_tokens = history_tokens
        self.history: HistoryStore | None = None
        # How a reasoning model's thinking is returned (--reasoning-format,
        # app/runtime/reasoning.py) where a request does not say.
        self.reasoning_format = REASONING_FORMAT
        # Where the loaded pair's calibrations are kept (loading/calibrations.py), and where each
        # drafter's came from; None for a pair handed in (it keeps none).
        self.calibrations: CalibrationFile | None = None
        self._pair = pair
        # None: llama.cpp's (loading/load.py); tests pass fakes.
        self._loader = loader
        self._mutex = threading.Lock()
        self._thread: threading.Thread | None = None
        self._names = ("", "")
        # The pairing record found at the last load (app/runtime/tuned.py): its choice is what
        # a request that chooses no speculation settings runs with.
        self.pairing = pairing or PairingUse()
        self.status = LoadStatus()
        if pair is not None:
            draft = pair.draft_backend.name if pair.draft_backend is not None else "none"
            self._names = (pair.target.backend.name, draft)
            self.status = LoadStatus(state=READY, message="ready", target=self._names[0], draft=draft)

    @property
    def pair(self) -> Pair:
        """The loaded pair, or NotReadyError saying why there is none."""
        s = self.status
        if self._pair is None or s.state != READY:
            if s.state == LOADING:
                raise NotReadyError(f"the models are still loading ({s.message}); try again in a moment")
            if s.state == ERROR:
                raise NotReadyError(f"no model is loaded: {s.message}")
            raise NotReadyError("no model is loaded; pick a pair in the Models tab")
        return self._pair

    def offer(self) -> Offer:
        """What a request may choose from on the loaded pair (NotReadyError without one)."""
        return Offer.of(self.pair, self.pairing.overrides)

    def _advance(self, message: str) -> None:
        self.status.step += 1
        self.status.message = message

    def load(self, target: ModelConfig, draft: ModelConfig | None,
             options: LoadOptions = LoadOptions()) -> str | None:
        """Load a pair now (blocking); it replaces the current one only once it is up. Returns
        the failure message, or None. On failure an already loaded pair stays in service."""
        names = (target.name or Path(target.path).name,
                 (draft.name or Path(draft.path).name) if draft else "none")
        steps = ["checking files, compatibility and memory", f"loading target {names[0]}"]
        if draft is not None:
            steps.append(f"loading draft {names[1]}")
        self.status = LoadStatus(state=LOADING, message=steps[0], steps=steps,
                                 started=time.monotonic(), target=names[0], draft=names[1])
        messages = iter(steps[1:])

        def staged(config: ModelConfig) -> None:
            # Later models (early exit) are not load steps of their own.
            step = next(messages, None)
            if step is not None and self.status.state == LOADING:
                self._advance(step)

        try:
            if self.offload is not None and self.offload.used:
                # A pair with layers on the GPU holds the memory the next plan reads as free
                # (llama.cpp's registry): kept for a failed load, it would leave the new pair
                # only what it left over. It goes first; a failed load then leaves none.
                self._release()
            # The page's lines show in its status (below); `announce` hears the plan.
            opened = open_pair(PairRequest(target, draft, options, PairingRule(PAGE),
                                           history_tokens=self.history_tokens or None, say=QUIET),
                               loader=self._loader, progress=staged, announce=self._announce)
        except Exception as exc:  # noqa: BLE001 - any load failure must reach the page, not a log
            message = str(exc) if isinstance(exc, TandemError) else f"{type(exc).__name__}: {exc}"
            if self._pair is not None:
                old_target, old_draft = self._names
                self.status = LoadStatus(state=READY, message=f"still using {old_target} + {old_draft}",
                                         target=old_target, draft=old_draft, error=message)
            else:
                self.status = LoadStatus(state=ERROR, message=message, target=names[0], draft=names[1])
            return message
        pair, use = opened.pair, opened.pairing
        self.replace(pair)
        self.offload = opened.plan.offload
        self.settings = LoaderSettings.of_plan(opened.plan)
        self.history = opened.history
        self.calibrations = opened.calibrations
        self.pairing = use
        self._names = names
        self.status.step = len(steps)
        self.status.state = READY
        self.status.message = f"ready in {self.status.elapsed_s:.1f} s"
        if draft is not None and pair.draft_path and pair.draft_path != draft.path:
            # A heavy CPU draft runs as its requantized copy (LoadOptions.draft_quant).
            self.status.message += f"; draft runs as {Path(pair.draft_path).name}"
        for line in use.messages:
            self.status.message += f"; {line}"
        return None

    def load_async(self, target: ModelConfig, draft: ModelConfig | None,
                   options: LoadOptions = LoadOptions()) -> threading.Thread:
        return self.prepare_async(lambda: (target, draft), options)

    def prepare_async(self, prepare: Callable[[], tuple[ModelConfig, ModelConfig | None]],
                      options: LoadOptions = LoadOptions()) -> threading.Thread:
        """In a background thread: `prepare()` the configs (it may fetch the embedded files), then load."""
        def run() -> None:
            try:
                target, draft = prepare()
            except Exception as exc:  # noqa: BLE001 - shown in the page
                self.fail(str(exc) if isinstance(exc, TandemError) else
                          f"the models could not be prepared ({type(exc).__name__}: {exc})")
                return
            self.load(target, draft, options)

        with self._mutex:
            if self._thread is not None and self._thread.is_alive():
                raise NotReadyError("a pair is already loading; wait for it to finish")
            self.status = LoadStatus(state=LOADING, message="preparing the model files",
                                     steps=["preparing the model files"], started=time.monotonic())
            self._thread = threading.Thread(target=run, name="tandem-load", daemon=True)
            self._thread.start()
            return self._thread

    def fail(self, message: str) -> None:
        """Record a failure found before loading could start (no embedded files, bad flags)."""
        self.status = LoadStatus(state=ERROR, message=message)

    def replace(self, pair: Pair) -> None:
        # The load that made `pair` says where its calibrations are kept, after this.
        self.calibrations = None
        old = self._pair
        if old is not None:
            # After the running generation and those waiting before this: none runs on it then.
            with self.queue.slot(always=True):
                self._pair = pair
                self.queue.set_parallel(pair.parallel)
            old.close()
        else:
            self._pair = pair
            self.queue.set_parallel(pair.parallel)

    def history_for(self, owner: str = LOCAL) -> History | None:
        """Owner's history of past requests, None when history is off."""
        return History(self.history, owner) if self.history is not None else None

    def wait(self, timeout: float | None = None) -> LoadStatus:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self.status

    def _release(self) -> None:
        """Close the loaded pair once its generation in flight ends, and forget its plan."""
        if self._pair is not None:
            with self.queue.slot(always=True):
                self._pair.close()
            self._pair = None
        self.offload = None
        self.settings = None

    def close(self) -> None:
        self._release()
        self.status = LoadStatus()

"""Adapting the draft to its target as the app runs it: the command line's `tandem adapt` and the
Models tab's action both call `run_adapt` here, which names the pair's record by its files
(app/runtime/tuned.py `key_for`, adapters included), gives a new record the defaults and the
proof the files a load will serve (`served_file`), then runs the one adaptation
(bench/adapt/session.py). Only the way progress shows differs."""
from __future__ import annotations

from dataclasses import replace

from app.runtime.open_pair import served_file
from bench.adapt import session
from bench.adapt.build import Result
from bench.adapt.settings import Settings
from engine.backend import ModelConfig
from engine.errors import SettingsError


def _default():
    """The configuration a load uses without a record, for a record adapt makes."""
    from app.runtime.defaults import DEFAULT_DRAFTER, DEFAULT_GAMMA, DEFAULT_POLICY, LOAD
    from models.candidate import Candidate
    return Candidate(DEFAULT_DRAFTER, draft_quant=LOAD.draft_quant, draft_vocab=LOAD.draft_vocab,
                     policy=DEFAULT_POLICY, gamma=DEFAULT_GAMMA[DEFAULT_POLICY])


def user_prompts(path: str | None, categories: list[str] | None, tcfg: ModelConfig
                 ) -> session.Prompts:
    """A prompts file's prompts (a suite JSONL, or one prompt per line), else the requests in
    the user's history of this target."""
    if not path:
        return session.history_prompts(tcfg)
    from app.runtime.prompt_sets import read_prompts
    chosen = read_prompts(path, categories)
    return session.text_prompts([(p.category, p.prompt) for p in chosen])


def run_adapt(tcfg: ModelConfig, dcfg: ModelConfig | None, prompts: session.Prompts,
              settings: Settings, threads: int | None, progress: session.Progress,
              force: bool = False) -> Result:
    """Adapt `dcfg`'s draft to the target `tcfg` (with its adapters): the one entry of the
    command line and the Models tab. Unless `force`, a pair whose base draft already accepts
    more than ADAPT_DECLINE_ABOVE is declined before training."""
    from app.runtime.defaults import ADAPT_DECLINE_ABOVE
    from app.runtime.tuned import key_for
    settings = replace(settings, decline_above=None if force else ADAPT_DECLINE_ABOVE)
    from engine.llama.backend import default_threads
    if dcfg is None:
        raise SettingsError("tandem adapt trains a draft model; drop --draft none")
    key = key_for(tcfg.path, dcfg.path, tcfg.lora)
    return session.adapt_pair(tcfg, dcfg, key, prompts, settings, threads or default_threads(),
                              progress, _default(), served_file(tcfg))

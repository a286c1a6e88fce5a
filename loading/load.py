"""Loading a target (and optional draft) into the engine's Pair: a plan, then its execution.

`loading.plan.plan_load` reads each header once and checks the files, the pair's tokenizer
compatibility and the memory budget before llama.cpp touches memory, and decides what to
derive: a heavy draft on the CPU is loaded as its derived Q4_0 copy unless
`LoadOptions.draft_quant` says "off", and with a trimmed output vocabulary when
`LoadOptions.draft_vocab` says "trim"; the early-exit drafter is derived from the target when
the options ask for it. `execute` derives the files and loads the models, each by `loader`,
llama.cpp's by default (tests pass fakes), and warms each up unless the options say not
(loading/warmup.py); a backend already loaded is closed again when a later step fails (an
`ExitStack` holds each until the pair owns it).
"""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace
from typing import Callable

from engine.llama import backend as llama
from engine.backend import Backend, ModelConfig
from engine.drafters.early_exit import early_exit_drafter
from engine.pair import DEFAULT_CHAIN_MIN, Pair
from loading.adapters import adapter_for_layers
from loading.derived.early_exit import default_layers, derive_early_exit
from loading.derived.embeddings import load_trimmed
from loading.derived.quantized import Quantizer, derive_quantized
from loading.derived.vocab_trim import derive_trimmed
from loading.options import LoadOptions
from loading.plan import LoadPlan, plan_load
from loading.warmup import warm_up
from models.gguf_info import GGUFInfo, read_info
from models.machine import Machine

Loader = Callable[[ModelConfig], Backend]
# Hears the plan once it is made, before anything loads (the commands print its offload line).
Announce = Callable[[LoadPlan], None]
# Hears each model's config just before it is loaded (the app's progress steps).
Progress = Callable[[ModelConfig], None]


def _loader(loader: Loader | None, progress: Progress | None = None,
            warmup: bool = False) -> Loader:
    """`loader` (llama.cpp's by default, looked up at the call so a test may stand in for it),
    telling `progress` of each model first and warming each up after (loading/warmup.py)."""
    chosen = loader or llama.load
    if progress is None and not warmup:
        return chosen

    def load(config: ModelConfig) -> Backend:
        if progress is not None:
            progress(config)
        backend = chosen(config)
        if warmup:
            with ExitStack() as owned:
                owned.callback(backend.close)
                warm_up(backend)
                owned.pop_all()
        return backend
    return load


def load_pair(target: ModelConfig, draft: ModelConfig | None,
              options: LoadOptions = LoadOptions(), loader: Loader | None = None,
              p_min: float = 0.0, lookup_ngram: int = 3, quantizer: Quantizer | None = None,
              chain_min: float = DEFAULT_CHAIN_MIN, progress: Progress | None = None,
              announce: Announce | None = None, machine: Machine | None = None) -> Pair:
    """Plan the load (check the files, place the models, decide the derivations), then execute
    it; `p_min`, `lookup_ngram` and `chain_min` go to Pair, `quantizer` stands in for llama.cpp's
    when deriving a requantized draft, `machine` for the devices llama.cpp reports."""
    plan = plan_load(target, draft, options, machine=machine)
    if announce is not None:
        announce(plan)
    return execute(plan, loader, p_min=p_min,
                   lookup_ngram=lookup_ngram, quantizer=quantizer, chain_min=chain_min,
                   progress=progress)


def served_draft(plan: LoadPlan, quantizer: Quantizer | None = None) -> ModelConfig | None:
    """The draft's config as `plan` loads it: its requantized copy (derived now unless a current
    one exists) where the plan asks for one, else the file as given."""
    if plan.draft is None or plan.draft_quant is None:
        return plan.draft
    return replace(plan.draft, path=str(derive_quantized(plan.draft.path, plan.draft_quant,
                                                         quantizer)))


def execute(plan: LoadPlan, loader: Loader | None = None, p_min: float = 0.0,
            lookup_ngram: int = 3, quantizer: Quantizer | None = None,
            chain_min: float = DEFAULT_CHAIN_MIN, progress: Progress | None = None) -> Pair:
    """Derive the files `plan` asks for, load the models and build the Pair."""
    load = _loader(loader, progress, warmup=plan.warmup)
    target, draft, trimmed = plan.target, plan.draft, None
    draft_info = plan.draft_info
    if draft is not None:
        if plan.draft_quant is not None:
            draft = served_draft(plan, quantizer) or draft
            # The requantized file is another file; the trimmed one is derived from it.
            draft_info = read_info(draft.path) if plan.trim_vocab else None
        if plan.trim_vocab:
            trimmed = replace(draft, path=str(derive_trimmed(draft.path, info=draft_info)))
    with ExitStack() as owned:
        target_backend = load(target)
        owned.callback(target_backend.close)
        draft_backend = None
        if trimmed is not None:
            assert draft_info is not None
            draft_backend = _load_trimmed(draft_info, trimmed, load)
        elif draft is not None:
            draft_backend = load(draft)
        if draft_backend is not None:
            owned.callback(draft_backend.close)
        pair = Pair(target_backend, draft_backend, p_min=p_min, lookup_ngram=lookup_ngram,
                    chain_min=chain_min, parallel=slots_of(target),
                    draft_path=(trimmed or draft).path if draft is not None else None)
        if plan.early_exit_layers is not None:
            add_early_exit(pair, target, plan.early_exit_layers, load,
                           gpu_layers=plan.early_exit_gpu_layers, info=plan.target_info)
        # Loaded whole: the pair owns the backends now, and closes them with itself.
        owned.pop_all()
    return pair


def slots_of(config: ModelConfig) -> int:
    """The generations a pair decodes together: one per sequence of its target's cache but
    sequence 0, the pair's own (engine/slots.py's `sequences_for`); one when it holds one."""
    return max(1, config.n_seq - 1)


def _load_trimmed(source: GGUFInfo, trimmed: ModelConfig, load: Loader) -> Backend:
    """The draft with a trimmed vocabulary: its derived head, read through the source's
    tokenizer and embeddings (loading/derived/embeddings.py), which then owns the head."""
    with ExitStack() as owned:
        inner = load(trimmed)
        owned.callback(inner.close)
        backend = load_trimmed(source, trimmed.path, inner)
        owned.pop_all()
    return backend


def add_early_exit(pair: Pair, target: ModelConfig, layers: int | None = None,
                   loader: Loader | None = None, gpu_layers: int | None = None,
                   info: GGUFInfo | None = None) -> None:
    """Derive (or reuse) the first-`layers` GGUF of `target`, the pair's target file (default:
    three quarters of its layers), load it and add it to `pair` as drafter "early-exit", with
    the GPU layers the plan gave it (None: the target's); `info` is the target's header when
    the caller has read it."""
    if layers is None:
        layers = default_layers((info or read_info(target.path)).n_layer)
    path = derive_early_exit(target.path, layers, info=info)
    # An adapted target drafts through its own first layers, adapter included.
    lora = tuple((str(adapter_for_layers(p, layers)), s) for p, s in target.lora)
    gpu = target.n_gpu_layers if gpu_layers is None else gpu_layers
    backend = _loader(loader)(replace(target, path=str(path), lora=lora, n_gpu_layers=gpu))
    pair.add_drafter("early-exit", early_exit_drafter(backend, p_min=pair.p_min,
                                                      chain_min=pair.chain_min), backend=backend,
                     per_slot=lambda seq: early_exit_drafter(seq, p_min=pair.p_min,
                                                             chain_min=pair.chain_min))

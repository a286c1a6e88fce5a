"""A load's plan: what to check, derive and load, decided from each file's header, read once.

`plan_load` reads the target's and the draft's GGUF headers into one description each
(`models.gguf_info.GGUFInfo`) and makes every check from them before anything is derived or
loaded: each file's trained context, the pair's tokenizer compatibility, the adapters, and,
unless the options skip it, the memory budget (a target on RPC workers probes each worker). From
the same headers it decides the derivations: the draft's requantization, its trimmed vocabulary,
the early-exit depth. The plan is data a test can inspect without loading anything;
`loading.load.execute` carries it out.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from engine.backend import ModelConfig
from engine.errors import SettingsError
from engine.limits import check_ctx_trained
from engine.rpc import probe_all
from loading.adapters import adapter_bytes, check_adapters
from loading.derived.early_exit import default_layers
from loading.derived.quantized import resolve as resolve_quant
from loading.options import DRAFT_VOCAB_CHOICES, LoadOptions
from models.budget import WorkerMemory, require_fits
from models.compat import compare, require
from models.gguf_info import GGUFInfo, read_info

# Probes a target's RPC workers for their memory (engine/rpc.py; tests script the workers).
Probe = Callable[[Sequence[str]], Sequence[WorkerMemory]]


@dataclass(frozen=True)
class LoadPlan:
    target: ModelConfig
    target_info: GGUFInfo
    draft: ModelConfig | None = None
    draft_info: GGUFInfo | None = None
    # The draft's requantization to derive ("q4_0", ...; None: the file as given), whether it
    # loads with a trimmed output vocabulary, and the early-exit drafter's depth (None: none).
    draft_quant: str | None = None
    trim_vocab: bool = False
    early_exit_layers: int | None = None


def plan_load(target: ModelConfig, draft: ModelConfig | None,
              options: LoadOptions = LoadOptions(), probe: Probe = probe_all) -> LoadPlan:
    """Read each header once, check the load against them and decide its derivations."""
    if options.draft_vocab not in DRAFT_VOCAB_CHOICES:
        raise SettingsError(f"unknown draft vocabulary {options.draft_vocab!r}; choose one "
                            f"of {', '.join(DRAFT_VOCAB_CHOICES)}")
    tinfo = read_info(target.path)
    check_ctx_trained(target.n_ctx, tinfo.n_ctx_train, Path(target.path).name)
    dinfo = None
    if draft is not None:
        dinfo = read_info(draft.path)
        check_ctx_trained(draft.n_ctx, dinfo.n_ctx_train, Path(draft.path).name)
        if options.check_compat:
            require(compare(tinfo, dinfo))
    check_adapters(tinfo, target.lora)
    if draft is not None and dinfo is not None:
        check_adapters(dinfo, draft.lora)
    if options.check_budget:
        # A target on RPC workers: each is probed (a one-line error naming one that does not
        # answer) and its share of the layers checked against the memory it reports.
        require_fits(tinfo, dinfo, workers=probe(target.rpc), **budget_settings(target, draft))
    quant = (resolve_quant(options.draft_quant, dinfo, draft.n_gpu_layers)
             if draft is not None and dinfo is not None else None)
    layers = None
    if options.wants_early_exit:
        layers = (options.early_exit_layers if options.early_exit_layers is not None
                  else default_layers(tinfo.n_layer))
    return LoadPlan(target, tinfo, draft, dinfo, draft_quant=quant,
                    trim_vocab=draft is not None and options.draft_vocab == "trim",
                    early_exit_layers=layers)


def budget_settings(target: ModelConfig, draft: ModelConfig | None) -> dict:
    """models.budget's keyword arguments for these configs' hardware settings."""
    kw = {"n_ctx": target.n_ctx, "gpu_layers": target.n_gpu_layers, "n_ubatch": target.n_batch,
          "adapter_bytes": (adapter_bytes(target.lora),
                            adapter_bytes(draft.lora) if draft is not None else 0)}
    if draft is not None:
        kw |= {"draft_n_ctx": draft.n_ctx, "draft_gpu_layers": draft.n_gpu_layers}
    return kw

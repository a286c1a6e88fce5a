"""A load's plan: what to check, derive and load, decided from each file's header, read once.

`plan_load` reads the target's and the draft's GGUF headers into one description each
(`models.gguf_info.GGUFInfo`) and makes every check from them before anything is derived or
loaded: each file's trained context, the pair's tokenizer compatibility, the adapters, and,
unless the options skip it, the memory budget (a target on RPC workers probes each worker). From
the same headers it decides the derivations: the draft's requantization, its trimmed vocabulary,
the early-exit depth. And it places every model on the GPU (`offload`, models/offload.py): GPU
layers left on "auto" (None) are decided by the budget's byte accounting against the devices
llama.cpp reports (loading/devices.py; tests pass a made-up `Machine`): the draft first, then
the target's layers, then the early-exit drafter in what is left. A draft that loads as a
derived copy (requantized, trimmed) is placed from that copy's bytes
(loading/derived/planned.py), and a model loaded later beside the pair (`tandem tune`'s
candidates) in the room it left (`place_later`). The plan is data a test can inspect without
loading anything; `loading.load.execute` carries it out.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from engine.backend import ModelConfig
from engine.errors import SettingsError
from engine.limits import check_ctx_trained
from engine.rpc import probe_all
from loading.adapters import adapter_bytes, check_adapters
from loading.derived.early_exit import default_layers
from loading.derived.planned import planned_draft
from loading.derived.quantized import resolve as resolve_quant
from loading.options import DRAFT_VOCAB_CHOICES, LoadOptions
from loading import devices
from models import budget
from models.budget import Layout, WorkerMemory
from models.compat import compare, require
from models.gguf_info import GGUFInfo, read_info
from models.machine import Machine, physical_cores
from models.offload import (OffloadPlan, Placement, first_layers, from_report, place_after,
                            placement)

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
    # Where every model goes (target and draft configs above carry the GPU layers it decided),
    # and the early-exit drafter's GPU layers.
    offload: OffloadPlan | None = None
    early_exit_gpu_layers: int = 0
    # The machine planned for, the GPU layers asked of target and draft (None: auto), and the
    # RAM the pair takes: what a model loaded later is placed after (`place_later`).
    machine: Machine | None = None
    asked: tuple[int | None, int | None] = (None, None)
    ram_used: int = 0
    # Warm each model up once loaded (LoadOptions.warmup).
    warmup: bool = True


def plan_load(target: ModelConfig, draft: ModelConfig | None,
              options: LoadOptions = LoadOptions(), probe: Probe = probe_all,
              machine: Machine | None = None) -> LoadPlan:
    """Read each header once, check the load against them, place the models and decide the
    derivations. `machine`: the devices to plan for (default: what llama.cpp reports)."""
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
    m = machine or devices.detect()
    # A target on RPC workers: each is probed (a one-line error naming one that does not
    # answer) and its share of the layers checked against the memory it reports.
    workers = probe(target.rpc) if options.check_budget and target.rpc else ()
    report = budget.estimate(tinfo, dinfo, workers=workers, machine=m,
                             **budget_settings(target, draft))
    asked, draft_asked = target.n_gpu_layers, draft.n_gpu_layers if draft else None
    given = (target, draft)
    target, draft, offload = _placed(report, target, tinfo, draft, dinfo, m)
    quant = (resolve_quant(options.draft_quant, dinfo, draft.n_gpu_layers or 0)
             if draft is not None and dinfo is not None else None)
    trim = draft is not None and options.draft_vocab == "trim"
    if dinfo is not None and (quant is not None or trim):
        # The draft loads as its requantized or trimmed copy: planned from that file's bytes,
        # not the source's (loading/derived/planned.py).
        derived = planned_draft(dinfo, quant, trim)
        report = budget.estimate(tinfo, derived, workers=workers, machine=m,
                                 **budget_settings(*given))
        target, draft, offload = _placed(report, given[0], tinfo, given[1], derived, m)
    if options.check_budget:
        budget.require(report)
    layers = None
    exit_gpu = 0
    if options.wants_early_exit:
        layers = (options.early_exit_layers if options.early_exit_layers is not None
                  else default_layers(tinfo.n_layer))
        offload, exit_gpu = _place_early_exit(offload, m, target, tinfo, layers,
                                              report.ram_needed, asked)
    return LoadPlan(target, tinfo, draft, dinfo, draft_quant=quant,
                    trim_vocab=trim,
                    early_exit_layers=layers, offload=offload, early_exit_gpu_layers=exit_gpu,
                    machine=m, asked=(asked, draft_asked), ram_used=report.ram_needed,
                    warmup=options.warmup)


def _placed(report: budget.BudgetReport, target: ModelConfig, tinfo: GGUFInfo,
            draft: ModelConfig | None, dinfo: GGUFInfo | None,
            m: Machine) -> tuple[ModelConfig, ModelConfig | None, OffloadPlan]:
    """The configs with the GPU layers the budget placed where they were "auto", and the plan.
    A model on RPC workers keeps every layer there (llama.cpp's -ngl -1) unless told otherwise;
    with the target there, the draft is planned alone on this machine's GPU."""
    lt = Layout.from_info(tinfo)
    ld = Layout.from_info(dinfo) if dinfo is not None else None
    if target.rpc:
        plan = from_report(report, lt, None, target_on="RPC workers")
        if draft is not None and ld is not None and not draft.rpc:
            alone = budget.estimate_pair(ld, None, machine=m, n_ctx=draft.n_ctx * draft.n_seq,
                                         kv_type=draft.kv_type, flash_attn=draft.flash_attn,
                                         gpu_layers=draft.n_gpu_layers, n_ubatch=draft.n_batch)
            plan = replace(plan, models=plan.models + (placement("draft", ld, alone.target),))
            draft = _resolved(draft, alone.target.gpu_layers)
    else:
        plan = from_report(report, lt, ld)
    target = _resolved(target, report.target.gpu_layers)
    if draft is not None and ld is not None and draft.rpc:
        # A draft on workers of its own: all its layers there, none of this machine's GPU.
        plan = replace(plan, models=tuple(p for p in plan.models if p.role != "draft") + (
            Placement("draft", ld.name, ld.n_layer + 1, ld.n_layer, on="RPC workers"),))
        draft = _resolved(draft, ld.n_layer + 1)
    elif draft is not None and not target.rpc:
        draft = _resolved(draft, report.draft.gpu_layers)
    return target, draft, plan


def _resolved(config: ModelConfig, placed: int) -> ModelConfig:
    """`config` with its GPU layers decided: a number given stays; "auto" on workers is all of
    them, else what the plan placed. A model with layers on this machine's GPU runs, unless
    told, on llama.cpp's threads for it (the physical cores: there the CPU mostly waits on the
    device and a thread per hyperthread only spins); on the CPU, Tandem's every core."""
    if config.n_gpu_layers is None:
        config = replace(config, n_gpu_layers=-1 if config.rpc else placed)
    if config.n_threads is None and placed and not config.rpc:
        config = replace(config, n_threads=physical_cores())
    return config


def _place_early_exit(plan: OffloadPlan, m: Machine, target: ModelConfig, tinfo: GGUFInfo,
                      layers: int, ram_used: int, asked: int | None) -> tuple[OffloadPlan, int]:
    """The early-exit drafter (the target's first `layers` blocks) after the pair. It loads
    with the target's settings: the target's GPU layers when they were a number (`asked`),
    else as many as the room the pair left holds; on the target's RPC workers, all there."""
    if target.rpc:
        return plan, -1 if asked is None else asked
    layout = first_layers(Layout.from_info(tinfo), layers, f"{Path(target.path).stem} first {layers}")
    plan = place_after(plan, m, "early exit", layout, n_ctx=target.n_ctx, n_ubatch=target.n_batch,
                       kv_type=target.kv_type, flash_attn=target.flash_attn, gpu_layers=asked,
                       ram_used=ram_used)
    return plan, plan.models[-1].gpu_layers if asked is None else asked


def place_later(plan: LoadPlan, role: str, info: GGUFInfo) -> int:
    """The GPU layers of a draft loaded beside the pair after the plan (`tandem tune`'s derived
    drafts, one at a time), planned from its own header `info` in the room the pair left: the
    draft's GPU layers when they were a number, else as many as fit."""
    if plan.machine is None or plan.offload is None or plan.draft is None:
        return 0
    draft = plan.draft
    if draft.rpc:
        return -1 if plan.asked[1] is None else plan.asked[1]
    placed = place_after(plan.offload, plan.machine, role, Layout.from_info(info),
                         n_ctx=draft.n_ctx * draft.n_seq, n_ubatch=draft.n_batch,
                         kv_type=draft.kv_type,
                         flash_attn=draft.flash_attn, gpu_layers=plan.asked[1],
                         ram_used=plan.ram_used)
    return placed.models[-1].gpu_layers


def place_early_exit(plan: LoadPlan, layers: int) -> int:
    """The GPU layers of an early-exit drafter of `layers` blocks loaded after the plan
    (`tandem tune`'s candidates), in the room the pair left."""
    if plan.machine is None or plan.offload is None:
        return 0
    return _place_early_exit(plan.offload, plan.machine, plan.target, plan.target_info, layers,
                             plan.ram_used, plan.asked[0])[1]


def budget_settings(target: ModelConfig, draft: ModelConfig | None) -> dict:
    """models.budget's keyword arguments for these configs' hardware settings (a cache holds
    n_ctx positions for each of its sequences: one per slot, and the pair's own)."""
    kw = {"n_ctx": target.n_ctx * target.n_seq, "gpu_layers": target.n_gpu_layers, "n_ubatch": target.n_batch,
          "kv_type": target.kv_type, "flash_attn": target.flash_attn,
          "adapter_bytes": (adapter_bytes(target.lora),
                            adapter_bytes(draft.lora) if draft is not None else 0)}
    if draft is not None:
        # A draft on its own RPC workers takes nothing of this machine's GPU.
        layers = 0 if draft.rpc and draft.n_gpu_layers is None else draft.n_gpu_layers
        kw |= {"draft_n_ctx": draft.n_ctx * draft.n_seq, "draft_gpu_layers": layers}
    return kw

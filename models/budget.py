"""Memory budget for a target/draft pair: weights, KV caches, compute and output buffers, per device.

The formulas follow what llama.cpp allocates (checked against its own buffer reports in
tests/test_models_budget.py):
- weights: every tensor, memory-mapped; on CPUs where llama.cpp repacks Q4_0/Q4_K/IQ4_NL matrices
  for SIMD, those layers' copies come on top. Offloaded layers live on the GPU instead: llama.cpp
  numbers the output matrix n_layer after the blocks and offloads from that end, so -ngl g puts
  the output matrix and the last g - 1 blocks there (`blocks_on_gpu`; g = n_layer + 1 is all).
- KV cache: n_ctx (padded to 256) x layers x (K + V widths) x bytes per element of the KV type;
  sliding-window layers keep only window + n_ubatch cells.
- compute buffer: the largest of the logits phase (n_vocab x n_ubatch f32) and the attention phase
  (one f32 n_kv x n_ubatch score matrix per head plus the mask), plus a few activation rows. With
  flash attention, which the backend turns on for a model with layers on a GPU, no score matrix
  is made: the attention phase is its activation rows. The feed-forward phase (gate, up and
  their product, n_ff x n_ubatch f32 each) is larger where n_ff is several times n_embd.
- an output matrix larger than the GPU takes in one product stays on the CPU, with its logits.
- output buffer: n_vocab f32 logits for one sequence (the engine does not keep all logits).
- RPC workers (`--rpc`): llama.cpp gives each worker a run of layers in proportion to the free
  memory it reports (the output matrix counts as one more layer and goes last); each worker then
  holds its layers' weights and KV cache plus an attention-sized compute buffer (the last one a
  logits-sized one). Token embeddings, the logits and the draft stay on this machine. The
  workers are counted as one device towards the verdict, then each is checked on its own.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol, Sequence

from engine.errors import DoesNotFitError, SettingsError
from models import machine as machine_mod
from models.gguf_info import GGUFInfo, read_info

MIB = 1 << 20
GIB = 1 << 30
KV_TYPES: dict[str, tuple[int, int]] = {"f16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18)}  # (block, bytes)
REPACKED_TYPES = {"Q4_0", "Q4_K", "IQ4_NL"}
KV_PAD = 256
RAM_SHARE = 0.9  # leave the OS and the app itself some room
GPU_SHARE = 0.95
_BLOCK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class Layout:
    """The sizes of one model that the budget needs, from its GGUF header."""
    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    layer_bytes: tuple[int, ...]
    layer_repack_bytes: tuple[int, ...]
    output_bytes: int
    output_repack_bytes: int
    other_bytes: int  # token embeddings and norms: always on the CPU
    sliding_window: int | None = None
    n_swa_layers: int = 0
    quant: str = "?"
    # A model without output.weight (tied embeddings) computes its logits with the token
    # embeddings, which llama.cpp also loads on the output's device (TENSOR_DUPLICATED): a
    # second copy there, while the first stays with the input on the CPU.
    output_copy_bytes: int = 0
    # The feed-forward width (ffn_up's rows): its activations are the largest of a block's
    # compute when it is several times n_embd (Qwen2.5 1.5B: 8960 of 1536).
    n_ff: int = 0

    @classmethod
    def from_info(cls, info: GGUFInfo) -> "Layout":
        layer = [0] * info.n_layer
        repack = [0] * info.n_layer
        output = output_repack = other = embd = n_ff = 0
        tied = not any(t.name.startswith("output.weight") for t in info.tensors)
        for t in info.tensors:
            packs = t.type_name in REPACKED_TYPES and len(t.shape) == 2 and not t.name.startswith("token_embd")
            m = _BLOCK.match(t.name)
            if m and int(m.group(1)) < info.n_layer:
                i = int(m.group(1))
                layer[i] += t.n_bytes
                repack[i] += t.n_bytes if packs else 0
                if t.name.endswith("ffn_up.weight") and len(t.shape) == 2:
                    n_ff = max(n_ff, t.shape[1])
            elif t.name.startswith("output.weight"):
                output += t.n_bytes
                output_repack += t.n_bytes if packs else 0
            else:
                other += t.n_bytes
                embd += t.n_bytes if t.name.startswith("token_embd.weight") else 0
        n_swa = 0
        if info.sliding_window:
            # Gemma 2 alternates local/global layers; Gemma 3 has one global layer in six.
            n_swa = info.n_layer - info.n_layer // 6 if info.architecture.startswith("gemma3") else info.n_layer // 2
        return cls(info.path.name, info.n_layer, info.n_embd, info.n_head, info.n_head_kv, info.head_dim_k,
                   info.head_dim_v, info.n_vocab, tuple(layer), tuple(repack), output, output_repack, other,
                   info.sliding_window, n_swa, info.file_type, embd if tied else 0, n_ff)


@dataclass(frozen=True)
class Breakdown:
    """Bytes one model needs, by component and device."""
    role: str
    name: str
    gpu_layers: int
    weights_cpu: int
    repack_cpu: int
    weights_gpu: int
    kv_cpu: int
    kv_gpu: int
    compute_cpu: int
    compute_gpu: int
    output_cpu: int
    # The compute buffer of a GPU holding blocks but not the output (several GPUs).
    attention_gpu: int = 0

    @property
    def cpu(self) -> int:
        return self.weights_cpu + self.repack_cpu + self.kv_cpu + self.compute_cpu + self.output_cpu

    @property
    def gpu(self) -> int:
        return self.weights_gpu + self.kv_gpu + self.compute_gpu


def _kv_bytes(n_elems: int, kv_type: str) -> int:
    block, size = KV_TYPES[kv_type]
    return -(-n_elems // block) * size


def blocks_on_gpu(gpu_layers: int, n_layer: int) -> int:
    """The blocks llama.cpp offloads for -ngl `gpu_layers` (-1: all): the output matrix is its
    layer n_layer and goes first (llama-model.cpp load_tensors: i_gpu_start = n_layer + 1 - ngl),
    so any positive count places it and one block fewer than the count."""
    if gpu_layers < 0:
        return n_layer
    return max(0, min(gpu_layers, n_layer + 1) - 1)


def estimate_model(layout: Layout, *, role: str, n_ctx: int, kv_type: str = "f16", gpu_layers: int = 0,
                   n_ubatch: int = 512, repack: bool = False, flash_attn: bool = False,
                   max_tensor: int = 0) -> Breakdown:
    """Bytes llama.cpp allocates for one model loaded with these settings. `max_tensor`: the
    largest weight the GPU takes in a matrix product (0: any); a larger output matrix stays on
    the CPU with its logits, as llama.cpp places it (Gemma 3 270M's 170 MiB tied output on Mesa's
    lavapipe, whose limit is 128 MiB)."""
    if kv_type not in KV_TYPES:
        raise SettingsError(f"unknown KV cache type {kv_type!r}; use one of {', '.join(KV_TYPES)}")
    if n_ctx < 1 or gpu_layers < 0 or n_ubatch < 1:
        raise SettingsError(f"context ({n_ctx}), GPU layers ({gpu_layers}) and batch ({n_ubatch}) must be positive")
    n = layout.n_layer
    g = blocks_on_gpu(gpu_layers, n)
    output_on_gpu = gpu_layers > 0 and not (
        max_tensor and max(layout.output_bytes, layout.output_copy_bytes) > max_tensor)
    on_gpu = range(n - g, n)
    w_gpu = sum(layout.layer_bytes[i] for i in on_gpu) + (layout.output_bytes if output_on_gpu else 0)
    w_cpu = sum(layout.layer_bytes) + layout.output_bytes + layout.other_bytes - w_gpu
    w_gpu += layout.output_copy_bytes if output_on_gpu else 0
    rp = 0
    if repack:
        rp = sum(layout.layer_repack_bytes[: n - g]) + (0 if output_on_gpu else layout.output_repack_bytes)

    n_kv = -(-n_ctx // KV_PAD) * KV_PAD
    width = layout.n_head_kv * (layout.head_dim_k + layout.head_dim_v)
    swa_kv = min(n_kv, -(-((layout.sliding_window or 0) + n_ubatch) // KV_PAD) * KV_PAD)
    per_layer = [_kv_bytes((swa_kv if i < layout.n_swa_layers else n_kv) * width, kv_type) for i in range(n)]
    kv_gpu = sum(per_layer[i] for i in on_gpu)
    kv_cpu = sum(per_layer) - kv_gpu

    f32 = 4
    ub = min(n_ubatch, n_ctx)
    rows = layout.n_embd * ub * f32
    logits = layout.n_vocab * ub * f32 + 3 * rows
    # A block's largest phase: attention (its score matrix unless flash attention), or the
    # feed-forward's gate, up and product activations (n_ff x n_ubatch f32 each).
    block = max((0 if flash_attn else (layout.n_head + 1) * n_kv * ub * f32) + 6 * rows,
                3 * layout.n_ff * ub * f32 + 2 * rows)
    comp_cpu = max(0 if output_on_gpu else logits, block if g < n else 0, rows)
    comp_gpu = max(logits if output_on_gpu else 0, block if g else 0)
    out = layout.n_vocab * f32
    return Breakdown(role, layout.name, gpu_layers, w_cpu, rp, w_gpu, kv_cpu, kv_gpu, comp_cpu, comp_gpu, out,
                     block if g else 0)


@dataclass
class BudgetReport:
    target: Breakdown
    draft: Breakdown
    machine: machine_mod.Machine
    n_ctx: int
    kv_type: str
    verdict: str  # "fits", "fits with offload", "does not fit"
    split: tuple[int, int] | None = None  # suggested (gpu_layers, draft_gpu_layers)
    suggestions: list[str] = field(default_factory=list)
    workers: list["WorkerShare"] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verdict != "does not fit"

    @property
    def ram_needed(self) -> int:
        return self.target.cpu + self.draft.cpu

    @property
    def gpu_needed(self) -> int:
        return self.target.gpu + self.draft.gpu

    def one_line(self) -> str:
        t, d = self.target, self.draft

        def gib(*parts: int) -> str:
            return f"{sum(parts) / GIB:.2f}"

        need = (f"target {t.name} + draft {d.name} at n_ctx {self.n_ctx} need {gib(self.ram_needed)} GiB RAM"
                f" (weights {gib(t.weights_cpu, d.weights_cpu, t.repack_cpu, d.repack_cpu)},"
                f" KV {gib(t.kv_cpu, d.kv_cpu)}, compute {gib(t.compute_cpu, d.compute_cpu)},"
                f" logits {gib(t.output_cpu, d.output_cpu)})")
        if self.gpu_needed:
            need += (f" and {gib(self.gpu_needed)} GiB GPU (weights {gib(t.weights_gpu, d.weights_gpu)},"
                     f" KV {gib(t.kv_gpu, d.kv_gpu)}, compute {gib(t.compute_gpu, d.compute_gpu)})")
        tail = f"; try {'; '.join(self.suggestions)}" if self.suggestions else ""
        return f"{need}; this machine has {self.machine.describe()}{tail}"

    def text(self) -> str:
        def mib(b: int) -> str:
            return f"{b / MIB:9.1f}"

        dev = "workers" if self.workers else "GPU"  # a target on RPC workers: theirs
        rows = [f"{'':18}{'target':>10}{'draft':>10}   (MiB, n_ctx {self.n_ctx}, KV {self.kv_type})"]
        t, d = self.target, self.draft
        for label, a, b in (("weights (CPU)", t.weights_cpu, d.weights_cpu),
                            ("repacked (CPU)", t.repack_cpu, d.repack_cpu),
                            ("KV cache (CPU)", t.kv_cpu, d.kv_cpu), ("compute (CPU)", t.compute_cpu, d.compute_cpu),
                            ("logits (CPU)", t.output_cpu, d.output_cpu), (f"weights ({dev})", t.weights_gpu, d.weights_gpu),
                            (f"KV cache ({dev})", t.kv_gpu, d.kv_gpu), (f"compute ({dev})", t.compute_gpu, d.compute_gpu)):
            if a or b:
                rows.append(f"{label:18}{mib(a)} {mib(b)}")
        rows.append(f"{'total RAM':18}{mib(t.cpu)} {mib(d.cpu)}  = {self.ram_needed / GIB:.2f} GiB")
        if self.gpu_needed:
            rows.append(f"{'total ' + dev:18}{mib(t.gpu)} {mib(d.gpu)}  = {self.gpu_needed / GIB:.2f} GiB")
        rows.append(f"machine: {self.machine.describe()}")
        rows.append(f"verdict: {self.verdict}" + (f" (--gpu-layers {self.split[0]} --draft-gpu-layers {self.split[1]})"
                                                  if self.split else ""))
        rows += [f"suggestion: {s}" for s in self.suggestions]
        rows += [w.describe() for w in self.workers]
        return "\n".join(rows)


def _fits(t: Breakdown, d: Breakdown, m: machine_mod.Machine, lt: "Layout | None" = None,
          ld: "Layout | None" = None) -> bool:
    ram, gpu = t.cpu + d.cpu, t.gpu + d.gpu
    if m.unified:
        pooled = ram + gpu <= m.ram_available * RAM_SHARE and gpu <= m.gpu_room
    else:
        pooled = ram <= m.ram_available * RAM_SHARE and gpu <= m.gpu_room
    if not pooled or len(m.gpus) < 2 or lt is None:
        return pooled
    return all(used <= gpu.free - machine_mod.GPU_MARGIN
               for used, gpu in zip(pair_device_bytes(t, d, lt, ld, m), m.gpus))


def device_bytes(layout: "Layout", b: Breakdown, frees: Sequence[int]) -> list[int]:
    """What model `b` (estimated with its GPU layers) puts on each of several GPUs whose free
    memory is `frees`, as llama.cpp splits it (llama-model.cpp load_tensors): layer il of the
    offloaded run goes to the first device whose cumulative share of the free memory exceeds
    its place in the run; the output matrix is the run's last layer, so the last card holds it
    with the logits-sized compute buffer, each other card holding blocks an attention-sized
    one. KV cache goes with its blocks; adapters' bytes with the output."""
    n = layout.n_layer
    act = min(_all_as(b.gpu_layers, layout), n + 1)
    out = [0] * len(frees)
    if act <= 0 or not frees:
        return out
    start = n + 1 - act
    shares = [max(f, 0) for f in frees]
    shares = shares if any(shares) else [1] * len(frees)
    cum, acc = [], 0.0
    for f in shares:
        acc += f / sum(shares)
        cum.append(acc)
    owner = {il: next((i for i, c in enumerate(cum) if c > (il - start) / act), len(frees) - 1)
             for il in range(start, n + 1)}
    g = max(1, blocks_on_gpu(b.gpu_layers, n))
    placed = 0
    for i in range(len(frees)):
        blocks = [il for il, o in owner.items() if o == i and il < n]
        weights = sum(layout.layer_bytes[il] for il in blocks)
        holds_output = owner[n] == i
        if holds_output:
            # Unless the GPU refused it (estimate_model's max_tensor): then it is not in b.
            blocks_bytes = sum(layout.layer_bytes[n - blocks_on_gpu(b.gpu_layers, n):])
            weights += max(0, min(layout.output_bytes + layout.output_copy_bytes,
                                  b.weights_gpu - blocks_bytes))
        placed += weights
        compute = b.compute_gpu if holds_output else (b.attention_gpu if blocks else 0)
        out[i] = weights + b.kv_gpu * len(blocks) // g + compute
    out[owner[n]] += max(0, b.weights_gpu - placed)
    return out


def pair_device_bytes(t: Breakdown, d: Breakdown, lt: "Layout", ld: "Layout | None",
                      m: machine_mod.Machine) -> list[int]:
    """Each GPU's bytes of the pair: the target split by the free memory llama.cpp reads
    before it loads, the draft (loaded after it) by what the target left."""
    frees = [g.free for g in m.gpus]
    target = device_bytes(lt, t, frees)
    if ld is None or not d.gpu:
        return target
    draft = device_bytes(ld, d, [f - u for f, u in zip(frees, target)])
    return [a + b for a, b in zip(target, draft)]


def layout_of(model: GGUFInfo | Layout | str | Path) -> Layout:
    if isinstance(model, Layout):
        return model
    return Layout.from_info(model if isinstance(model, GGUFInfo) else read_info(model))


ModelLike = GGUFInfo | Layout | str | Path


def _empty_layout() -> Layout:
    return Layout("(no draft)", 0, 0, 0, 0, 0, 0, 0, (), (), 0, 0, 0)


def estimate_pair(target: ModelLike, draft: ModelLike | None, *, n_ctx: int = 4096, kv_type: str = "f16",
                  gpu_layers: int | None = 0, draft_gpu_layers: int | None = 0, n_ubatch: int = 512,
                  draft_n_ctx: int | None = None, machine: machine_mod.Machine | None = None,
                  adapter_bytes: tuple[int, int] = (0, 0), flash_attn: str = "auto") -> BudgetReport:
    """Estimate the pair's memory on this machine and decide: fits, fits with offload, or does not fit.

    `target` and `draft` are GGUF paths, parsed headers, or layouts; `draft` may be None (target only).
    The draft's context defaults to the target's, as speculative decoding needs; both models
    share `kv_type` and `flash_attn` ("auto", "on", "off": `flash_in_use`).
    `adapter_bytes` are the LoRA adapters' tensors of target and draft, counted with the layers
    they adapt (llama.cpp copies them in whole, beside those weights).
    GPU layers: a number (llama.cpp's -ngl: the output matrix and the last blocks, one fewer
    than the number, `blocks_on_gpu`; -1 all), or None, "auto": placed by `_auto_split` (the draft
    first, then the target's layers) in what the GPU holds less its margin. A number given is
    never changed.
    """
    m = machine or machine_mod.detect()
    lt = layout_of(target)
    ld = layout_of(draft) if draft is not None else _empty_layout()
    d_ctx = draft_n_ctx or n_ctx
    if not m.has_gpu:
        # A CPU-only llama.cpp ignores n_gpu_layers, so the request cannot change where memory goes.
        gpu_layers = draft_gpu_layers = 0
    if draft is None:
        draft_gpu_layers = 0

    def est(g: int, dg: int, ctx: int = n_ctx, kv: str = kv_type) -> tuple[Breakdown, Breakdown]:
        t = _with_adapter(estimate_model(lt, role="target", n_ctx=ctx, kv_type=kv,
                                         gpu_layers=_all_as(g, lt), n_ubatch=n_ubatch,
                                         repack=m.cpu_repacks,
                                         flash_attn=flash_in_use(flash_attn, m.has_gpu and g != 0, kv),
                                         max_tensor=m.gpu_max_tensor),
                          lt, adapter_bytes[0])
        if draft is None:
            return t, Breakdown("draft", ld.name, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        dctx = max(256, d_ctx * ctx // n_ctx)
        d = estimate_model(ld, role="draft", n_ctx=dctx, kv_type=kv, gpu_layers=_all_as(dg, ld),
                           n_ubatch=n_ubatch, repack=m.cpu_repacks,
                           flash_attn=flash_in_use(flash_attn, m.has_gpu and dg != 0, kv),
                           max_tensor=m.gpu_max_tensor)
        return t, _with_adapter(d, ld, adapter_bytes[1])

    if gpu_layers is None or draft_gpu_layers is None:
        gpu_layers, draft_gpu_layers = _auto_split(lt, ld, est, m, gpu_layers, draft_gpu_layers)
    t, d = est(gpu_layers, draft_gpu_layers)
    report = BudgetReport(t, d, m, n_ctx, kv_type, "fits")
    if _fits(t, d, m, lt, ld):
        return report
    if m.has_gpu:
        split = _auto_split(lt, ld, est, m, None, None if draft is not None else 0)
        if _fits(*est(*split), m, lt, ld):
            report.target, report.draft = est(*split)
            report.verdict, report.split = "fits with offload", split
            report.suggestions.append(f"offload: --gpu-layers {split[0]} --draft-gpu-layers {split[1]}")
            return report
    report.verdict = "does not fit"
    report.suggestions += _suggestions(lt, ld, est, m, n_ctx, kv_type, gpu_layers, draft_gpu_layers)
    return report


def flash_in_use(flash_attn: str, on_gpu: bool, kv_type: str) -> bool:
    """Whether a model's context runs flash attention, as engine/attention.py decides it:
    "on", "off", or auto: with layers on a GPU llama.cpp's own auto, counted as on (each GPU
    backend Tandem builds runs it; where one does not, llama.cpp's larger score buffer is
    the plan's margin's), on the CPU only for a quantized KV cache, which needs it."""
    if flash_attn != "auto":
        return flash_attn == "on"
    return on_gpu or kv_type != "f16"


def _auto_split(lt: Layout, ld: Layout, est, m: machine_mod.Machine, g_given: int | None,
                dg_given: int | None) -> tuple[int, int]:
    """GPU layers for the models left on "auto" (None): the draft first, whole if it fits,
    since it decodes gamma times a round; then as many of the target's layers as fit, from the
    output end, as llama.cpp offloads them (the output matrix first, n_layer + 1 is all). A number
    given stays. Where nothing fits, auto places nothing and the verdict says why."""
    drafts = [dg_given] if dg_given is not None else range(ld.n_layer + 1, -1, -1)
    targets = [g_given] if g_given is not None else range(lt.n_layer + 1, -1, -1)
    for dg in drafts:
        for g in targets:
            if _fits(*est(g, dg), m, lt, ld):
                return g, dg
    return (g_given if g_given is not None else 0, dg_given if dg_given is not None else 0)


def _all_as(layers: int, layout: Layout) -> int:
    """llama.cpp's -1 (every layer, the output matrix too) as a count."""
    return layout.n_layer + 1 if layers < 0 else layers


def _with_adapter(b: Breakdown, layout: Layout, n_bytes: int) -> Breakdown:
    """A model's breakdown with its LoRA adapters' tensors beside the layers they adapt: on
    the GPU for the offloaded share of its blocks."""
    on_gpu = n_bytes * blocks_on_gpu(b.gpu_layers, layout.n_layer) // max(layout.n_layer, 1)
    return replace(b, weights_cpu=b.weights_cpu + n_bytes - on_gpu,
                   weights_gpu=b.weights_gpu + on_gpu)


def _suggestions(lt: Layout, ld: Layout, est, m: machine_mod.Machine, n_ctx: int, kv_type: str,
                 g: int, dg: int) -> list[str]:
    out = []
    ctx = n_ctx // 2
    while ctx >= 256:
        if _fits(*est(g, dg, ctx), m, lt, ld):
            out.append(f"a smaller context: --ctx {ctx} fits")
            break
        ctx //= 2
    for kv in ("q8_0", "q4_0"):
        if KV_TYPES[kv][1] / KV_TYPES[kv][0] < KV_TYPES[kv_type][1] / KV_TYPES[kv_type][0] and _fits(*est(g, dg, kv=kv), m, lt, ld):
            out.append(f"a quantized KV cache: --kv-type {kv} fits")
            break
    t, d = est(g, dg)
    if d.gpu and m.has_gpu and t.gpu + d.gpu > m.gpu_room:
        out.append(f"fewer draft GPU layers (now {dg}): the GPU is short by "
                   f"{(t.gpu + d.gpu - m.gpu_room) / MIB:.0f} MiB")
    draft_weights = sum(ld.layer_bytes) + ld.output_bytes + ld.other_bytes
    if re.match(r"(Q[5-8]|F16|BF16|ALL_F32)", ld.quant):
        out.append(f"a smaller draft quantization than {ld.quant} (Q4_K_M is about half of Q8_0): the draft's"
                   f" weights take {draft_weights / MIB:.0f} MiB")
    short = t.cpu + d.cpu - m.ram_available * RAM_SHARE
    if short > 0:
        out.append(f"free {short / MIB:.0f} MiB of RAM, or pick a smaller target from `tandem models list`")
    return out


class WorkerMemory(Protocol):
    """What the budget needs of an RPC worker (engine.rpc.WorkerInfo, from its probe)."""
    endpoint: str
    free: int
    total: int


@dataclass(frozen=True)
class WorkerShare:
    """What one RPC worker holds of the target: layers [first, last) (index n_layer is the
    output matrix) and their bytes."""
    endpoint: str
    free: int
    first: int
    last: int
    n_layer: int
    weights: int
    kv: int
    compute: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute

    @property
    def fits(self) -> bool:
        return self.total <= self.free * GPU_SHARE

    def describe(self) -> str:
        blocks = min(self.last, self.n_layer) - self.first
        what = (f"layers {self.first}-{min(self.last, self.n_layer) - 1}" if blocks > 0 else "no layers")
        what += " + output" if self.last > self.n_layer else ""
        return (f"worker {self.endpoint}: {what}: weights {self.weights / MIB:.1f}, KV "
                f"{self.kv / MIB:.1f}, compute {self.compute / MIB:.1f} = {self.total / MIB:.1f} "
                f"MiB of {self.free / MIB:.0f} MiB free")


def worker_split(target: ModelLike, workers: Sequence[WorkerMemory], *, n_ctx: int = 4096,
                 kv_type: str = "f16", gpu_layers: int = -1, n_ubatch: int = 512) -> list[WorkerShare]:
    """llama.cpp's layer split over RPC workers (llama-model.cpp load_tensors): layer il of
    n_layer + 1 goes to the first worker whose cumulative share of the free memory exceeds
    il / (n_layer + 1); `gpu_layers` < 0 offloads them all, else the last `gpu_layers`."""
    lt = layout_of(target)
    n = lt.n_layer
    if not workers:
        return []
    offload = n + 1 if gpu_layers < 0 else min(gpu_layers, n + 1)
    start = n + 1 - offload
    total_free = sum(w.free for w in workers) or len(workers)
    cum, acc = [], 0.0
    for w in workers:
        acc += (w.free or total_free / len(workers)) / total_free
        cum.append(acc)
    owner: list[int | None] = [None] * (n + 1)
    for il in range(start, n + 1):
        frac = (il - start) / offload
        owner[il] = next((i for i, c in enumerate(cum) if c > frac), len(workers) - 1)
    kv_all = estimate_model(lt, role="target", n_ctx=n_ctx, kv_type=kv_type, gpu_layers=n + 1,
                            n_ubatch=n_ubatch)
    per_layer_kv = kv_all.kv_gpu / max(n, 1)
    f32 = 4
    ub = min(n_ubatch, n_ctx)
    n_kv = -(-n_ctx // KV_PAD) * KV_PAD
    rows = lt.n_embd * ub * f32
    attention = (lt.n_head + 1) * n_kv * ub * f32 + 6 * rows
    logits = lt.n_vocab * ub * f32 + 3 * rows
    out = []
    for i, w in enumerate(workers):
        mine = [il for il in range(n + 1) if owner[il] == i]
        blocks = [il for il in mine if il < n]
        weights = sum(lt.layer_bytes[il] for il in blocks) + (
            lt.output_bytes + lt.output_copy_bytes if n in mine else 0)
        compute = max(attention if blocks else 0, logits if n in mine else 0)
        out.append(WorkerShare(w.endpoint, w.free, mine[0] if mine else 0,
                               mine[-1] + 1 if mine else 0, n, weights,
                               int(per_layer_kv * len(blocks)), compute))
    return out


def estimate_rpc(target: ModelLike, draft: ModelLike | None, workers: Sequence[WorkerMemory], *,
                 n_ctx: int = 4096, kv_type: str = "f16", gpu_layers: int = -1,
                 n_ubatch: int = 512, draft_n_ctx: int | None = None,
                 machine: machine_mod.Machine | None = None) -> BudgetReport:
    """estimate_pair for a target spread over RPC workers: this machine keeps the target's
    embeddings, logits and the draft; each worker's share is checked against its free memory."""
    m = machine or machine_mod.detect()
    lt = layout_of(target)
    offload = lt.n_layer + 1 if gpu_layers < 0 else gpu_layers
    pooled = machine_mod.Machine(m.ram_total, m.ram_available, gpu_name=f"{len(workers)} RPC workers",
                                 gpu_free=sum(w.free for w in workers),
                                 gpu_total=sum(w.total for w in workers), cpu_repacks=m.cpu_repacks,
                                 gpu_margin=int(sum(w.free for w in workers) * (1 - GPU_SHARE)))
    report = estimate_pair(lt, draft, n_ctx=n_ctx, kv_type=kv_type, gpu_layers=offload,
                           n_ubatch=n_ubatch, draft_n_ctx=draft_n_ctx, machine=pooled)
    report.machine = m
    if report.verdict == "fits with offload":
        # Fewer layers on the workers would mean a local share this report does not price.
        report.verdict = "does not fit"
    report.split, report.suggestions = None, [s for s in report.suggestions if "offload" not in s]
    report.workers = worker_split(lt, workers, n_ctx=n_ctx, kv_type=kv_type,
                                  gpu_layers=gpu_layers, n_ubatch=n_ubatch)
    short = [w for w in report.workers if not w.fits]
    if short:
        report.verdict = "does not fit"
        report.suggestions.insert(0, f"more or larger workers: {short[0].describe()}")
    return report


def estimate(target: ModelLike, draft: ModelLike | None = None,
             workers: Sequence[WorkerMemory] = (), **kw) -> BudgetReport:
    """estimate_pair with a load's hardware settings in `kw` (loading/plan.py
    `budget_settings`), or estimate_rpc for a target spread over the probed RPC `workers`."""
    if workers:
        kw.pop("draft_gpu_layers", None)
        # Adapters are not counted on workers (nor supported there by the engine's checks).
        kw.pop("adapter_bytes", None)
        # A model on workers runs without flash attention (engine/attention.py: not on a GPU here).
        kw.pop("flash_attn", None)
        kw["gpu_layers"] = kw.get("gpu_layers") or -1
        return estimate_rpc(target, draft, workers, **kw)
    return estimate_pair(target, draft, **kw)


def require(report: BudgetReport) -> BudgetReport:
    """`report`, or DoesNotFitError (one line, numbers and suggestions) when the pair does not fit."""
    if not report.ok:
        err = DoesNotFitError(report.one_line())
        err.report = report  # type: ignore[attr-defined]  # the UI shows the full table
        raise err
    return report


def require_fits(target: ModelLike, draft: ModelLike | None = None,
                 workers: Sequence[WorkerMemory] = (), **kw) -> BudgetReport:
    """estimate, raising DoesNotFitError when the pair does not fit."""
    return require(estimate(target, draft, workers, **kw))

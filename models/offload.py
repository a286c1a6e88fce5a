"""Where a load puts each model's layers, caches and buffers: the offload plan, as data.

The budget (models/budget.py) decides the GPU layers from its byte accounting; this module
turns its report into what a user reads (`line`, one line printed once at every load, in the
app's header and in `tandem budget`) and what the API returns (`as_dict`). Layers are named
`placed/total` over the transformer blocks. llama.cpp's -ngl counts the output matrix too, and
offloads it first (models/budget.py `blocks_on_gpu`): -ngl g places g - 1 blocks, n_layer + 1
is every one.
A model loaded after the pair (the early-exit drafter, the target's first layers) gets the
room the pair left (`place_after`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from models.budget import (GIB, RAM_SHARE, Breakdown, BudgetReport, Layout, ModelLike,
                           blocks_on_gpu, device_bytes, estimate_pair, estimate_model, flash_in_use,
                           layout_of, pair_device_bytes)
from models.machine import GPU_MARGIN, Machine

# --gpu-layers and --draft-gpu-layers: "auto" (the plan places them), "all", or a number.
AUTO, ALL = "auto", "all"


def gpu_layers(text: str) -> int | None:
    """A GPU-layers option's value: None for auto, -1 for all, else the number (llama.cpp's
    -ngl; any count above the model's layers is all, bounds checked by engine/limits.py)."""
    word = text.strip().lower()
    if word == AUTO:
        return None
    if word == ALL:
        return -1
    return int(word)  # ValueError: argparse's one-line "invalid gpu_layers value"


# What a user does about a llama.cpp built for the CPU only.
GPU_BUILD_HINT = ("scripts/run builds llama.cpp for CUDA where nvcc is installed, for Metal on "
                  "Apple Silicon and for Vulkan where vulkaninfo sees a GPU")


@dataclass(frozen=True)
class Placement:
    """One model's share of the GPU: `gpu_layers` as handed to llama.cpp, and its bytes there."""
    role: str
    name: str
    gpu_layers: int
    n_layer: int
    weights: int = 0
    kv: int = 0
    compute: int = 0
    # "GPU", or "RPC workers" for a model spread over workers (their memory, not this GPU's).
    on: str = "GPU"

    @property
    def placed(self) -> int:
        """The blocks on the device (the output matrix goes with any positive count)."""
        return blocks_on_gpu(self.gpu_layers, self.n_layer)

    @property
    def gpu_bytes(self) -> int:
        return self.weights + self.kv + self.compute

    def text(self, device: str) -> str:
        where = self.on if self.on != "GPU" else device
        out = f"{self.role} {self.placed}/{self.n_layer} layers on {where}"
        if self.gpu_layers:
            out += f" ({self.gpu_bytes / GIB:.1f} GiB)"
        return out


@dataclass(frozen=True)
class OffloadPlan:
    """Every model's placement on the one (pooled) GPU, and that device's memory: free before
    the load, the margin kept, and why nothing is placed where nothing is."""
    models: tuple[Placement, ...]
    device: str = ""
    free: int = 0
    total: int = 0
    margin: int = 0
    unified: bool = False
    note: str = ""
    # Several GPUs: each one's (name, bytes planned, free before the load), as llama.cpp
    # splits the layers (models/budget.py `device_bytes`).
    devices: tuple[tuple[str, int, int], ...] = ()

    @property
    def used(self) -> int:
        return sum(p.gpu_bytes for p in self.models if p.on == "GPU")

    @property
    def left(self) -> int:
        return max(0, self.free - self.used)

    def placement(self, role: str) -> Placement | None:
        return next((p for p in self.models if p.role == role), None)

    def line(self) -> str:
        """One line: e.g. `target 28/28 layers on NVIDIA H200 (4.6 GiB) · draft 24/24 layers on
        GPU (0.6 GiB) · KV 0.4 GiB · 11.2 GiB free after, 1.0 GiB margin`."""
        if not self.device:
            counts = ", ".join(f"{p.role} 0/{p.n_layer}" for p in self.models if p.on == "GPU")
            on_workers = [p.text("") for p in self.models if p.on != "GPU"]
            return "; ".join(on_workers + [f"{counts} layers on a GPU: {self.note}"])
        parts = [p.text(self.device if i == 0 else "GPU") for i, p in enumerate(self.models)]
        kv = sum(p.kv for p in self.models if p.on == "GPU")
        compute = sum(p.compute for p in self.models if p.on == "GPU")
        if kv:
            parts.append(f"KV {kv / GIB:.1f} GiB")
        if compute:
            parts.append(f"compute {compute / GIB:.1f} GiB")
        if self.devices:
            parts.append("per GPU " + ", ".join(f"{name} {used / GIB:.1f} of {free / GIB:.1f} GiB"
                                                 for name, used, free in self.devices))
        shared = " (unified memory)" if self.unified else ""
        parts.append(f"{self.left / GIB:.1f} GiB free after{shared}, {self.margin / GIB:.1f} GiB margin")
        return " · ".join(parts) + (f"; {self.note}" if self.note else "")

    def as_dict(self) -> dict:
        """The plan for the API's model list and stats."""
        return {"device": self.device or None, "free_bytes": self.free, "total_bytes": self.total,
                "margin_bytes": self.margin, "unified_memory": self.unified, "note": self.note,
                "summary": self.line(),
                "devices": [{"name": n, "planned_bytes": u, "free_bytes": f}
                            for n, u, f in self.devices],
                "models": [{"role": p.role, "name": p.name, "gpu_layers": p.gpu_layers,
                            "layers_placed": p.placed, "layers_total": p.n_layer, "on": p.on,
                            "weights_bytes": p.weights, "kv_bytes": p.kv,
                            "compute_bytes": p.compute} for p in self.models]}


def placement(role: str, layout: Layout, part: Breakdown, on: str = "GPU") -> Placement:
    """A model's placement from its budget breakdown (the GPU layers it was estimated with)."""
    return Placement(role, layout.name, part.gpu_layers, layout.n_layer, part.weights_gpu,
                     part.kv_gpu, part.compute_gpu, on)


def from_report(report: BudgetReport, target: Layout, draft: Layout | None,
                target_on: str = "GPU") -> OffloadPlan:
    """The plan of a budget report: the layers it resolved and the bytes each model puts on the
    GPU (`target_on` "RPC workers" for a target spread over them)."""
    m = report.machine
    models = [placement("target", target, report.target, target_on)]
    if draft is not None:
        models.append(placement("draft", draft, report.draft))
    per_gpu: tuple[tuple[str, int, int], ...] = ()
    if len(m.gpus) > 1 and target_on == "GPU":
        used = pair_device_bytes(report.target, report.draft, target, draft, m)
        per_gpu = tuple((g.name, u, g.free) for g, u in zip(m.gpus, used))
    return OffloadPlan(tuple(models), devices=per_gpu, **device_fields(m))


def device_fields(m: Machine) -> dict:
    """OffloadPlan's device fields for machine `m`."""
    if not m.has_gpu:
        return {"note": m.gpu_note or "this machine has no GPU llama.cpp can use"}
    return {"device": m.gpu_name or "GPU", "free": m.gpu_free, "total": m.gpu_total,
            "margin": m.gpu_margin, "unified": m.unified}


def first_layers(layout: Layout, k: int, name: str) -> Layout:
    """The layout of a model made of `layout`'s first `k` blocks (the early-exit drafter)."""
    return replace(layout, name=name, n_layer=k, layer_bytes=layout.layer_bytes[:k],
                   layer_repack_bytes=layout.layer_repack_bytes[:k],
                   n_swa_layers=min(layout.n_swa_layers, k))


def place_after(plan: OffloadPlan, m: Machine, role: str, layout: Layout, *, n_ctx: int,
                n_ubatch: int, kv_type: str = "f16", flash_attn: str = "auto",
                gpu_layers: int | None = None, ram_used: int = 0) -> OffloadPlan:
    """`plan` with one more model loaded after it, on what the GPU has left less the margin
    (each card's, on several): as many of its layers as fit from the output end when
    `gpu_layers` is None, else the number given. `ram_used` is what the models before it take of RAM (unified memory shares it)."""
    def est(g: int):
        return estimate_model(layout, role=role, n_ctx=n_ctx, kv_type=kv_type, gpu_layers=g,
                              n_ubatch=n_ubatch, repack=m.cpu_repacks,
                              flash_attn=flash_in_use(flash_attn, m.has_gpu and g != 0, kv_type))

    if not m.has_gpu:
        chosen = 0
    elif gpu_layers is not None:
        chosen = layout.n_layer + 1 if gpu_layers < 0 else gpu_layers
    else:
        room = m.gpu_room - plan.used
        # Several GPUs: llama.cpp splits this model by what each has free when it loads.
        left = [free - used for _, used, free in plan.devices]
        chosen = 0
        for g in range(layout.n_layer + 1, 0, -1):
            b = est(g)
            ram = ram_used + b.cpu + (plan.used + b.gpu if m.unified else 0)
            per_card = all(u <= f - GPU_MARGIN for u, f in zip(device_bytes(layout, b, left), left))
            if b.gpu <= room and ram <= m.ram_available * RAM_SHARE and per_card:
                chosen = g
                break
    return replace(plan, models=plan.models + (placement(role, layout, est(chosen)),))


def plan_pair(target: ModelLike, draft: ModelLike | None, machine: Machine,
              **kw) -> tuple[BudgetReport, OffloadPlan]:
    """The budget and the offload plan of a pair on `machine`, GPU layers "auto" unless `kw`
    says otherwise (estimate_pair's settings): what `tandem budget` and the Models tab show
    before anything loads."""
    lt = layout_of(target)
    ld = layout_of(draft) if draft is not None else None
    kw = {"gpu_layers": None, "draft_gpu_layers": None} | kw
    report = estimate_pair(lt, ld, machine=machine, **kw)
    return report, from_report(report, lt, ld)

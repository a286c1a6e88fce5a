"""The loader's settings under the one set of names the CLI's options, `/v1/models` and the
Models tab share: `gpu_layers` and `draft_gpu_layers` (--gpu-layers, --draft-gpu-layers:
auto, all or a number), `ctx` (--ctx), `flash_attn` (--flash-attn: auto, on, off) and
`kv_type` (--kv-type: f16, q8_0, q4_0). The page shows the plan they make before anything
loads (models/offload.py `plan_pair`), and refuses a setting that does not fit with the
plan's one-line reason.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from app.runtime.defaults import CTX, FLASH_ATTN, GPU_LAYERS, KV_TYPE
from engine.backend import ModelConfig
from engine.errors import SettingsError
from loading import devices
from loading.plan import LoadPlan
from models.budget import BudgetReport
from models.machine import Machine
from models.offload import ALL, AUTO, OffloadPlan, gpu_layers, plan_pair

NAMES = ("gpu_layers", "draft_gpu_layers", "ctx", "flash_attn", "kv_type")


def option(name: str) -> str:
    """The CLI option of a setting: gpu_layers is --gpu-layers."""
    return "--" + name.replace("_", "-")


def layers_text(layers: int | None) -> str:
    """GPU layers as the options write them: auto (None), all (-1) or the number."""
    return AUTO if layers is None else ALL if layers < 0 else str(layers)


@dataclass(frozen=True)
class LoaderSettings:
    gpu_layers: str = GPU_LAYERS
    draft_gpu_layers: str = GPU_LAYERS
    ctx: int = CTX
    flash_attn: str = FLASH_ATTN
    kv_type: str = KV_TYPE

    def layers(self) -> tuple[int | None, int | None]:
        """Target and draft GPU layers as ModelConfig takes them; a one-line error naming the
        option for text that is not auto, all or a number."""
        out = []
        for name in ("gpu_layers", "draft_gpu_layers"):
            text = str(getattr(self, name))
            try:
                out.append(gpu_layers(text))
            except ValueError:
                raise SettingsError(f"{option(name)} takes auto, all or a number, "
                                    f"got {text!r}") from None
        return out[0], out[1]

    def configs(self, target: ModelConfig, draft: ModelConfig | None
                ) -> tuple[ModelConfig, ModelConfig | None]:
        """`target` and `draft` with these settings (ModelConfig checks each value)."""
        g, dg = self.layers()
        shared = {"n_ctx": int(self.ctx), "flash_attn": self.flash_attn, "kv_type": self.kv_type}
        return (replace(target, n_gpu_layers=g, **shared),
                replace(draft, n_gpu_layers=dg, **shared) if draft is not None else None)

    def plan(self, target: Path, draft: Path | None,
             machine: Machine | None = None) -> tuple[BudgetReport, OffloadPlan]:
        """The budget and offload plan these settings make for the files, before loading."""
        t, d = self.configs(ModelConfig(str(target)),
                            ModelConfig(str(draft)) if draft is not None else None)
        return plan_pair(target, draft, machine or devices.detect(), n_ctx=t.n_ctx,
                         kv_type=t.kv_type, flash_attn=t.flash_attn, gpu_layers=t.n_gpu_layers,
                         draft_gpu_layers=d.n_gpu_layers if d is not None else 0)

    @classmethod
    def of_plan(cls, plan: LoadPlan) -> "LoaderSettings":
        """The settings a load was asked for (GPU layers as given, not as placed)."""
        return cls(layers_text(plan.asked[0]), layers_text(plan.asked[1]), plan.target.n_ctx,
                   plan.target.flash_attn, plan.target.kv_type)

    def as_dict(self) -> dict:
        return asdict(self)

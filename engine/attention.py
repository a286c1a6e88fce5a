"""A context's attention settings: flash attention and the KV cache's type, as llama.cpp's
`--flash-attn auto|on|off` and `--cache-type-k/-v` (one type for both here).

auto hands llama.cpp its own "auto" for a model with layers on a GPU: it turns flash attention
on where every layer's device runs it (llama-context.cpp resolve_fused_ops). A model wholly on
the CPU keeps it off, as every CPU figure was measured, unless its KV cache is quantized:
llama.cpp quantizes the V cache only with flash attention, so auto turns it on there, as
llama.cpp's auto does, and "off" with a quantized cache is refused before anything loads.
"""
from __future__ import annotations

from engine.errors import SettingsError

FLASH_ATTN = ("auto", "on", "off")
# The KV cache types offered, by llama.cpp's names (models/budget.py sizes each).
KV_TYPES = ("f16", "q8_0", "q4_0")
# When not given (a ModelConfig's defaults, the CLI's, the app's).
DEFAULT_FLASH_ATTN = "auto"
DEFAULT_KV_TYPE = "f16"


def check_attention(flash_attn: str, kv_type: str) -> None:
    """Refuse a setting llama.cpp cannot take, in one line."""
    if flash_attn not in FLASH_ATTN:
        raise SettingsError(f"unknown flash attention setting {flash_attn!r}; choose one of "
                            f"{', '.join(FLASH_ATTN)}")
    if kv_type not in KV_TYPES:
        raise SettingsError(f"unknown KV cache type {kv_type!r}; choose one of "
                            f"{', '.join(KV_TYPES)}")
    if flash_attn == "off" and kv_type != "f16":
        raise SettingsError(f"a {kv_type} KV cache needs flash attention (llama.cpp quantizes "
                            "the V cache only with it); use --flash-attn auto or on")


def flash_attn_on(flash_attn: str, on_gpu: bool, kv_type: str) -> bool | None:
    """Whether the context runs flash attention: True, False, or None where llama.cpp decides
    (auto with layers on a GPU)."""
    if flash_attn != "auto":
        return flash_attn == "on"
    if on_gpu:
        return None
    return kv_type != "f16"

"""Requantizing a GGUF with llama.cpp's own quantizer (the derived drafts,
loading/derived/quantized.py)."""
from __future__ import annotations

from pathlib import Path

import llama_cpp

from engine.errors import ModelFileError, SettingsError
from engine.llama.backend import default_threads

# llama.cpp's file types for the quantizations Tandem derives.
# "pure" Q4_K_M is Q4_K throughout.
FTYPES = {"q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
          "q4_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M}


def quantize(src: Path, dst: Path, kind: str, threads: int | None = None,
             pure: bool = True) -> None:
    """Requantize every tensor of `src` to `kind` with llama.cpp's quantizer ("pure": the
    embeddings and output head too, since on a draft they are a quarter of the work; not pure,
    llama.cpp's own mix, as Q4_K_M files on the hub are made: scripts/gpu_check.py)."""
    if kind not in FTYPES:
        raise SettingsError(f"unknown quantization {kind!r}; choose one of {', '.join(FTYPES)}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[kind]
    params.allow_requantize = True
    params.pure = pure
    params.nthread = threads or default_threads()
    # The quantizer logs every tensor (dropped by quiet_llama's callback); a failure is reported
    # by its return code.
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise ModelFileError(f"llama.cpp could not quantize {Path(src).name} to {kind} "
                             f"(is it a complete GGUF model?)")

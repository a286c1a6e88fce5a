"""The llama.cpp resources Tandem holds, each with one small owner over llama-cpp-python's
low-level API (as thin as its `_internals`): a loaded model with its vocabulary (`Model`), a
context (`Context`), a batch (`Batch`), a LoRA adapter (`Adapter`).

`close()` frees a resource once (a second call does nothing) and `with` closes it. A backend
enters the ones it holds on an `ExitStack`, so closing it, or a failure half-way through
building it, frees them in the reverse order of their making: adapters and the context before
the model they belong to.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import llama_cpp

from engine.errors import ModelFileError

_backend_ready = False

# llama.cpp's flash attention types: on, off, and its own "auto" (None).
FLASH_ATTN_TYPES = {True: llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                    False: llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
                    None: llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO}
# The KV cache types of engine/attention.py as ggml's.
KV_GGML_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0,
                 "q4_0": llama_cpp.GGML_TYPE_Q4_0}


def _init_backend() -> None:
    # Once per process, before the first model (as llama-cpp-python's Llama does).
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_backend_init()
        _backend_ready = True


class Owned:
    """One llama.cpp resource and its one owner: `close()` frees it, and is safe to call twice;
    `with` closes it on the way out."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Model(Owned):
    """A GGUF file loaded by llama.cpp (`vocab_only`: its tokenizer alone), and its vocabulary."""

    def __init__(self, path: Path, what: str = "load", n_gpu_layers: int = 0,
                 vocab_only: bool = False) -> None:
        _init_backend()
        params = llama_cpp.llama_model_default_params()
        # -1: every layer (llama.cpp takes INT32_MAX for "all").
        params.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers == -1 else n_gpu_layers
        params.vocab_only = vocab_only
        self.model: Any = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
        if self.model is None:
            raise ModelFileError(f"llama.cpp could not {what} {path.name}")
        self.vocab: Any = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab: int = int(llama_cpp.llama_vocab_n_tokens(self.vocab))

    def tokenize(self, data: bytes, add_special: bool, parse_special: bool) -> list[int]:
        n = len(data) + 8
        tokens = (llama_cpp.llama_token * n)()
        got = llama_cpp.llama_tokenize(self.vocab, data, len(data), tokens, n, add_special,
                                       parse_special)
        if got < 0:
            n = -got
            tokens = (llama_cpp.llama_token * n)()
            got = llama_cpp.llama_tokenize(self.vocab, data, len(data), tokens, n, add_special,
                                           parse_special)
            if got < 0:
                raise ModelFileError(f"llama.cpp could not tokenize {len(data)} bytes")
        return list(tokens[:got])

    def piece(self, token: int, special: bool) -> bytes:
        """The bytes of `token` (`special`: control tokens as their text, else empty)."""
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def text(self, token: int) -> str:
        """A token's text as the vocabulary stores it ("" for none, a negative id)."""
        if token < 0:
            return ""
        return (llama_cpp.llama_vocab_get_text(self.vocab, token) or b"").decode(
            "utf-8", errors="replace")

    def chat_template(self) -> str | None:
        template = llama_cpp.llama_model_chat_template(self.model, None)
        return template.decode("utf-8") if template else None

    def metadata(self) -> dict[str, str]:
        """The header's scalar metadata as llama.cpp reports it (values as strings)."""
        out = {}
        for i in range(llama_cpp.llama_model_meta_count(self.model)):
            out[self._meta(llama_cpp.llama_model_meta_key_by_index, i)] = \
                self._meta(llama_cpp.llama_model_meta_val_str_by_index, i)
        return out

    def _meta(self, read, i: int) -> str:
        buf = ctypes.create_string_buffer(1024)
        n = read(self.model, i, buf, len(buf))
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            read(self.model, i, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def close(self) -> None:
        if self.model is not None:
            llama_cpp.llama_model_free(self.model)
            self.model = None


class Context(Owned):
    """A llama.cpp context on `model`: its KV cache (of `kv_type`, engine/attention.py) and its
    decode threads, with flash attention on (True), off (False) or llama.cpp's auto (None);
    `n_seq` sequences of up to n_ctx positions each share one unified cache of n_seq * n_ctx
    cells (llama-server's slots with --kv-unified)."""

    def __init__(self, model: Model, n_ctx: int, n_batch: int, n_threads: int,
                 flash_attn: bool | None = False, kv_type: str = "f16", n_seq: int = 1) -> None:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx * n_seq
        params.n_seq_max = n_seq
        params.kv_unified = True
        params.n_batch = params.n_ubatch = min(n_ctx, n_batch)
        params.n_threads = params.n_threads_batch = n_threads
        params.flash_attn_type = FLASH_ATTN_TYPES[flash_attn]
        params.type_k = params.type_v = KV_GGML_TYPES[kv_type]
        self.ctx: Any = llama_cpp.llama_init_from_model(model.model, params)
        if self.ctx is None:
            raise ModelFileError("llama.cpp could not create a context of "
                                 f"{n_ctx} tokens (out of memory?)")
        self.memory: Any = llama_cpp.llama_get_memory(self.ctx)

    @property
    def n_ctx(self) -> int:
        """The positions one sequence may hold (the unified cache holds them all)."""
        return int(llama_cpp.llama_n_ctx(self.ctx))

    @property
    def n_batch(self) -> int:
        return int(llama_cpp.llama_n_batch(self.ctx))

    def close(self) -> None:
        if self.ctx is not None:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None


class Batch(Owned):
    """A llama_batch of up to `n_tokens` inputs: token ids, or embeddings of `n_embd` floats."""

    def __init__(self, n_tokens: int, n_embd: int = 0) -> None:
        self.batch: Any = llama_cpp.llama_batch_init(n_tokens, n_embd, 1)

    def close(self) -> None:
        if self.batch is not None:
            llama_cpp.llama_batch_free(self.batch)
            self.batch = None


class Adapter(Owned):
    """A GGUF LoRA adapter loaded into `model` (it belongs to the model: freed before it)."""

    def __init__(self, model: Model, path: str | Path, owner: str) -> None:
        # A failure is reported by the None returned.
        self.adapter = llama_cpp.llama_adapter_lora_init(model.model, str(path).encode())
        if self.adapter is None:
            raise ModelFileError(f"llama.cpp could not apply the LoRA adapter "
                                 f"{Path(path).name} to {owner} (is it a LoRA "
                                 "adapter GGUF made for this model?)")

    def close(self) -> None:
        if self.adapter is not None:
            llama_cpp.llama_adapter_lora_free(self.adapter)
            self.adapter = None

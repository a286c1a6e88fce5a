"""The llama.cpp backend: with engine/llama/ (the device registry), the only code in Tandem that
imports `llama_cpp`.

Logits are requested per row of a batch (llama_batch.logits flags) and copied only for those
rows; `logits_all` stays off, since a 151,936-token vocabulary times n_ctx floats would cost
gigabytes. KV-cache truncation uses llama.cpp's memory API on sequence 0.

Each llama.cpp resource has one small owner (`Owned`: `close()` frees it once, `with` closes
it): the loaded model with its context (`LoadedModel`), a batch (`Batch`), a LoRA adapter
(`Adapter`). A backend enters the ones it holds on an `ExitStack`, so closing it, or a failure
half-way through building it, frees them in the reverse order of their making: adapters before
the model they belong to.

llama.cpp is kept quiet through its log callback, never by touching the process's streams
(see `quiet_llama_cpp`).
"""
from __future__ import annotations

import ctypes
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Sequence, cast

import llama_cpp
import numpy as np
from llama_cpp import _internals as llama_internals
from llama_cpp import llama as llama_module
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from engine.backend import F32, ModelConfig
from engine.errors import DecodeError, ModelFileError, SettingsError
from engine.isolated import IsolatedBackend
from engine.llama import devices
from engine.rpc import WorkerError, probe_all


@llama_cpp.llama_log_callback
def _drop_llama_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """llama.cpp's log callback. Its messages are progress and diagnostics; every failure it
    reports through a return value becomes Tandem's own one-line error, so none is shown."""


class _NoRedirect:
    """Stands in for llama-cpp-python's `suppress_stdout_stderr`, which silences a load by
    pointing file descriptors 1 and 2 of the whole process at /dev/null: whatever any other
    thread printed meanwhile was lost (the app's URL line, tracebacks), and two loads that
    overlapped could restore the wrong stream. The log callback silences llama.cpp instead."""

    def __init__(self, disable: bool = True) -> None:
        pass

    def __enter__(self) -> "_NoRedirect":
        return self

    def __exit__(self, *_exc) -> None:
        return None


def quiet_llama_cpp() -> None:
    """Send llama.cpp's messages to `_drop_llama_log`, and keep llama-cpp-python's quiet mode
    (verbose=False, which also skips its own prints of the model's metadata) from redirecting
    the process's streams. Idempotent; run when this module is imported."""
    llama_cpp.llama_log_set(_drop_llama_log, ctypes.c_void_p(0))
    for module in (llama_module, llama_internals):
        setattr(module, "suppress_stdout_stderr", _NoRedirect)  # a module global, by name


quiet_llama_cpp()


def default_threads() -> int:
    return max(1, os.cpu_count() or 1)


class Owned:
    """One llama.cpp resource and its one owner: `close()` frees it, and is safe to call twice;
    `with` closes it on the way out."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LoadedModel(Owned):
    """A GGUF file loaded by llama-cpp-python (`Llama`, quiet): the model, its vocabulary and,
    unless `vocab_only`, a context. The backend decodes through the raw pointers."""

    def __init__(self, path: Path, what: str = "load", **params: Any) -> None:
        try:
            self.llm: llama_cpp.Llama | None = llama_cpp.Llama(model_path=str(path),
                                                               verbose=False, **params)
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelFileError(f"llama.cpp could not {what} {path.name}: {exc}") from None
        self.model = self.llm._model.model
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab: int = self.llm.n_vocab()

    @property
    def loaded(self) -> llama_cpp.Llama:
        if self.llm is None:
            raise ModelFileError("the model was closed")
        return self.llm

    def close(self) -> None:
        if self.llm is not None:
            self.llm.close()
            self.llm = None


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

    def __init__(self, model: LoadedModel, path: str | Path, owner: str) -> None:
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


class LlamaBackend:
    def __init__(self, config: ModelConfig) -> None:
        path = Path(config.path)
        if not path.is_file():
            raise ModelFileError(f"model file not found: {path}")
        gpu_layers = config.n_gpu_layers or 0
        if config.rpc:
            add_rpc_workers(config.rpc)
            # Every layer on the workers unless told otherwise (llama.cpp's -ngl).
            gpu_layers = gpu_layers or -1
        # A model with layers on a GPU gets flash attention (llama.cpp's default "auto" turns it
        # on where the device runs it; llama-cpp-python offers only on or off); on the CPU it
        # stays off, as every CPU figure was measured. (The plan sizes the threads for a GPU.)
        on_gpu = gpu_layers != 0 and not config.rpc and bool(devices.gpus())
        threads = config.n_threads or default_threads()
        self.name = config.name or path.name
        self.config = config
        # What this backend owns, freed in reverse order by `close` (or by a failed __init__).
        self._owned = ExitStack()
        with self._owned:
            self._model = self._owned.enter_context(LoadedModel(
                path, n_ctx=config.n_ctx, n_batch=config.n_batch, n_ubatch=config.n_batch,
                n_threads=threads, n_threads_batch=threads, n_gpu_layers=gpu_layers,
                flash_attn=on_gpu, logits_all=False))
            llm = self._model.loaded
            self.n_vocab: int = self._model.n_vocab
            # llama.cpp pads a small context up (16 became 256); the context asked for is the
            # limit the user set, so it is the one the engine keeps to.
            self.n_ctx: int = min(config.n_ctx, llm.n_ctx())
            self._ctx = llm._ctx.ctx
            self._vocab = self._model.vocab
            self._mem = llama_cpp.llama_get_memory(self._ctx)
            # llama.cpp clamps the batch to the context (llama-cpp-python to
            # min(n_ctx, n_batch)): chunks sized from the config overran it and aborted the
            # process in GGML_ASSERT.
            self.n_batch: int = int(llama_cpp.llama_n_batch(self._ctx))
            self._n_batch = self.n_batch
            self._batch = self._owned.enter_context(Batch(self._n_batch))
            self.n_embd: int = llama_cpp.llama_model_n_embd(self._model.model)
            # Allocated on first use: only a draft with a trimmed vocabulary decodes embeddings.
            self._embd_batch: Batch | None = None
            self._piece_cache: dict[int, bytes] = {}
            if config.lora:
                self._apply_adapters(config.lora)
            # Built whole: from here on the resources are the backend's, freed by `close`.
            self._owned = self._owned.pop_all()

    def _apply_adapters(self, lora: Sequence[tuple[str, float]]) -> None:
        """Load GGUF LoRA adapters into the model and set them on the context at their scales
        (llama.cpp adds scale * alpha / rank * B A to each adapted matrix at every decode)."""
        owned = [self._owned.enter_context(Adapter(self._model, p, self.name)).adapter
                 for p, _ in lora]
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * len(lora))(*owned)
        scales = (ctypes.c_float * len(lora))(*[float(s) for _, s in lora])
        if llama_cpp.llama_set_adapters_lora(self._ctx, adapters, len(lora), scales):
            raise ModelFileError(f"llama.cpp could not set the LoRA adapters on {self.name}")

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self._model.loaded.tokenize(text.encode("utf-8"), add_bos=add_special,
                                           special=parse_special)

    def token_bytes(self, token: int) -> bytes:
        piece = self._piece_cache.get(token)
        if piece is None:
            buf = ctypes.create_string_buffer(64)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            piece = buf.raw[:n]
            self._piece_cache[token] = piece
        return piece

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def metadata(self) -> dict[str, str]:
        return dict(self._model.loaded.metadata)

    def chat_prompt(self, messages: Sequence[dict]) -> str:
        llm = self._model.loaded
        template = llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise ModelFileError(f"{self.name} has no chat template; use raw mode (--raw)")
        model = llm._model

        def text_of(tok: int) -> str:
            return model.token_get_text(tok) if tok >= 0 else ""

        fmt = Jinja2ChatFormatter(template=template, eos_token=text_of(model.token_eos()),
                                  bos_token=text_of(model.token_bos()))
        # Plain dicts, which llama-cpp-python types as its message TypedDicts.
        return fmt(messages=cast("list[Any]", list(messages))).prompt

    def decode(self, tokens: Sequence[int], pos: int, rows: Sequence[int]) -> F32:
        bad = [int(t) for t in tokens if not 0 <= int(t) < self.n_vocab]
        if bad:
            raise SettingsError(f"token id {bad[0]} is outside the vocabulary of {self.name} "
                                f"({self.n_vocab} tokens)")
        b = self._batch.batch

        def fill(start: int, n: int) -> None:
            for j in range(n):
                b.token[j] = int(tokens[start + j])

        return self._run(b, len(tokens), pos, rows, fill)

    def decode_embeddings(self, embd: F32, pos: int, rows: Sequence[int]) -> F32:
        """As `decode`, with input embeddings `[n, n_embd]` in place of token ids (a draft whose
        vocabulary was trimmed embeds tokens it no longer has; engine/trimmed_backend.py)."""
        embd = np.ascontiguousarray(embd, dtype=np.float32)
        if embd.ndim != 2 or embd.shape[1] != self.n_embd:
            raise SettingsError(f"embeddings must be [n, {self.n_embd}], got {embd.shape}")
        if self._embd_batch is None:
            self._embd_batch = self._owned.enter_context(Batch(self._n_batch, self.n_embd))
        b = self._embd_batch.batch
        base = ctypes.addressof(b.embd.contents)

        def fill(start: int, n: int) -> None:
            ctypes.memmove(base, embd[start:start + n].ctypes.data, n * self.n_embd * 4)

        return self._run(b, len(embd), pos, rows, fill)

    def _run(self, b, n_total: int, pos: int, rows: Sequence[int],
             fill: Callable[[int, int], None]) -> F32:
        """Decode n_total inputs in chunks of n_batch (`fill(start, n)` writes a chunk's inputs
        into `b`) and copy the logits of `rows` only."""
        # Checked here, not left to llama.cpp, which aborts or misbehaves on them.
        if n_total < 1 or pos < 0 or pos + n_total > self.n_ctx:
            raise DecodeError(f"cannot decode {n_total} tokens at position {pos}: the context "
                              f"holds {self.n_ctx}; raise --ctx")
        if any(not 0 <= r < n_total for r in rows):
            raise DecodeError(f"logit rows {list(rows)} are outside a batch of {n_total}")
        out = np.empty((len(rows), self.n_vocab), dtype=np.float32)
        for start in range(0, n_total, self._n_batch):
            n = min(self._n_batch, n_total - start)
            fill(start, n)
            for j in range(n):
                b.pos[j] = pos + start + j
                b.n_seq_id[j] = 1
                b.seq_id[j][0] = 0
                b.logits[j] = False
            for r in rows:
                if start <= r < start + n:
                    b.logits[r - start] = True
            b.n_tokens = n
            rc = llama_cpp.llama_decode(self._ctx, b)
            if rc != 0:
                # The chunks before this one stay cached; the session truncates them away.
                raise DecodeError(f"llama.cpp could not decode {n} tokens at position "
                                  f"{pos + start} (code {rc})")
            for i, r in enumerate(rows):
                if start <= r < start + n:
                    ptr = llama_cpp.llama_get_logits_ith(self._ctx, r - start)
                    out[i] = np.ctypeslib.as_array(
                        ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))
        return out

    def truncate(self, n: int) -> None:
        llama_cpp.llama_memory_seq_rm(self._mem, 0, n, -1)

    def close(self) -> None:
        # Safe to call twice: the stack is empty once it has run. Adapters, then batches, then
        # the model, the reverse of their making.
        self._owned.close()

    def __enter__(self) -> LlamaBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Vocabulary(Owned):
    """A model file's tokenizer alone (llama.cpp's vocab-only load: no weights, no context)."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if not path.is_file():
            raise ModelFileError(f"model file not found: {path}")
        self._model = LoadedModel(path, what="read the vocabulary of", vocab_only=True)
        self._vocab = self._model.vocab
        self.n_vocab: int = self._model.n_vocab

    def tokenize(self, data: bytes) -> list[int]:
        """Plain text to ids: no BOS, special-token text left as text."""
        return self._model.loaded.tokenize(data, add_bos=False, special=False)

    def piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        return buf.raw[:n]

    def is_control(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_control(self._vocab, token))

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def close(self) -> None:
        self._model.close()


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
    # The quantizer logs every tensor (dropped by the log callback); a failure is reported by
    # its return code.
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise ModelFileError(f"llama.cpp could not quantize {Path(src).name} to {kind} "
                             f"(is it a complete GGUF model?)")


def add_rpc_workers(endpoints: Sequence[str]) -> None:
    """Register RPC workers as llama.cpp devices (as llama.cpp's own `--rpc` does), after
    probing each: llama.cpp aborts the process on a worker it cannot reach. Registered devices
    are offered to every model this process loads next, hence one process per RPC model
    (engine/isolated.py)."""
    if not llama_cpp.llama_supports_rpc():
        raise WorkerError("this llama-cpp-python was built without RPC; run scripts/run (or "
                          "scripts/test) to install the RPC build")
    for info in probe_all(endpoints):
        if info.devices == 0:
            raise WorkerError(f"RPC worker {info.endpoint} offers no device")
    ggml = ggml_lib()
    reg = ggml.ggml_backend_reg_by_name(b"RPC")
    add = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(
        ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server"))
    for endpoint in endpoints:
        if endpoint not in _REGISTERED:
            ggml.ggml_backend_register(add(endpoint.encode()))
            _REGISTERED.add(endpoint)


_REGISTERED: set[str] = set()


def ggml_lib() -> ctypes.CDLL:
    """The ggml registry functions, looked up through libllama's own handle: dlsym then finds
    the libggml that libllama is linked to. (llama_cpp._ggml loads the wheel's `libggml.so`, a
    separate copy of the file: a second registry that libllama never sees.)"""
    lib = llama_cpp.llama_cpp._lib
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_register.restype = None
    return lib


def load(config: ModelConfig) -> LlamaBackend | IsolatedBackend:
    """The model as a backend; one spread over RPC workers runs in its own process, which a lost
    worker's abort takes down instead of Tandem (engine/isolated.py)."""
    if config.rpc:
        return IsolatedBackend(config, LlamaBackend)
    return LlamaBackend(config)

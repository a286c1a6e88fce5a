"""The llama.cpp backend (engine/backend.py's interface) and a model file's tokenizer alone.

Logits are requested per row of a batch (llama_batch.logits flags) and copied only for those
rows, never for the whole batch: a 151,936-token vocabulary times n_ctx floats would cost
gigabytes. KV-cache truncation uses llama.cpp's memory API on sequence 0. The model, the
context, the batches and the adapters are owned by engine/llama/resources.py's small owners.
"""
from __future__ import annotations

import ctypes
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Sequence, cast

import llama_cpp
import numpy as np
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from engine.attention import flash_attn_on
from engine.backend import F32, ModelConfig, TokenTable
from engine.errors import DecodeError, ModelFileError, SettingsError
from engine.isolated import IsolatedBackend
from engine.llama.resources import Adapter, Batch, Context, Model, Owned
from engine.llama.quiet import quiet_llama
from engine.llama import devices
from engine.llama.rpc import add_rpc_workers


def default_threads() -> int:
    return max(1, os.cpu_count() or 1)


class LlamaBackend:
    def __init__(self, config: ModelConfig) -> None:
        path = Path(config.path)
        if not path.is_file():
            raise ModelFileError(f"model file not found: {path}")
        threads = config.n_threads or default_threads()
        # None is "auto" left unplanned (a backend built without a loading plan): the CPU.
        gpu_layers = config.n_gpu_layers or 0
        if config.rpc:
            add_rpc_workers(config.rpc)
            # Every layer on the workers unless told otherwise (llama.cpp's -ngl).
            gpu_layers = gpu_layers or -1
        # Flash attention as the config says: auto is llama.cpp's own for a model with layers
        # on a GPU, off on the CPU (engine/attention.py). (The plan sizes the threads.)
        on_gpu = gpu_layers != 0 and not config.rpc and bool(devices.gpus())
        flash = flash_attn_on(config.flash_attn, on_gpu, config.kv_type)
        self.name = config.name or path.name
        self.config = config
        # What this backend owns, freed in reverse order by `close` (or by a failed __init__).
        self._owned = ExitStack()
        with self._owned:
            self._model = self._owned.enter_context(Model(path, n_gpu_layers=gpu_layers))
            context = self._owned.enter_context(Context(self._model, config.n_ctx,
                                                        config.n_batch, threads,
                                                        flash_attn=flash,
                                                        kv_type=config.kv_type))
            self.n_vocab: int = self._model.n_vocab
            # llama.cpp pads a small context up (16 became 256); the context asked for is the
            # limit the user set, so it is the one the engine keeps to.
            self.n_ctx: int = min(config.n_ctx, context.n_ctx)
            self._ctx = context.ctx
            self._vocab = self._model.vocab
            self._mem = context.memory
            # llama.cpp clamps the batch to the context: chunks sized from the config overran
            # it and aborted the process in GGML_ASSERT.
            self.n_batch: int = context.n_batch
            self._n_batch = self.n_batch
            self._batch = self._owned.enter_context(Batch(self._n_batch))
            self.n_embd: int = llama_cpp.llama_model_n_embd(self._model.model)
            # Allocated on first use: only a draft with a trimmed vocabulary decodes embeddings.
            self._embd_batch: Batch | None = None
            self._piece_cache: dict[int, bytes] = {}
            self._token_table: TokenTable | None = None
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
        return self._model.tokenize(text.encode("utf-8"), add_special, parse_special)

    def token_bytes(self, token: int) -> bytes:
        piece = self._piece_cache.get(token)
        if piece is None:
            piece = self._piece_cache[token] = self._model.piece(token, special=False)
        return piece

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def token_table(self) -> TokenTable:
        # As llguidance's own llama.cpp reader: control tokens, and user-defined ones written
        # like them (<tool_call>), as their text and flagged.
        if self._token_table is None:
            self._token_table = _token_table(self._model, self.n_vocab)
        return self._token_table

    def metadata(self) -> dict[str, str]:
        return self._model.metadata()

    def chat_prompt(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str:
        template = self._model.chat_template()
        if not template:
            raise ModelFileError(f"{self.name} has no chat template; use raw mode (--raw)")
        model = self._model
        fmt = Jinja2ChatFormatter(template=template,
                                  eos_token=model.text(llama_cpp.llama_vocab_eos(self._vocab)),
                                  bos_token=model.text(llama_cpp.llama_vocab_bos(self._vocab)))
        # Plain dicts, which llama-cpp-python types as its message TypedDicts.
        # llama-cpp-python's formatter hands `tools` to the template as its `tools` variable.
        return fmt(messages=cast("list[Any]", list(messages)),
                   tools=None if tools is None else cast("list[Any]", list(tools))).prompt

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
        self._model = Model(path, what="read the vocabulary of", vocab_only=True)
        self._vocab = self._model.vocab
        self.n_vocab: int = self._model.n_vocab

    def tokenize(self, data: bytes) -> list[int]:
        """Plain text to ids: no BOS, special-token text left as text."""
        return self._model.tokenize(data, add_special=False, parse_special=False)

    def piece(self, token: int) -> bytes:
        return self._model.piece(token, special=True)

    def is_control(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_control(self._vocab, token))

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def token_table(self) -> TokenTable:
        """Every token's bytes, as the loaded model's backend gives them to a grammar engine."""
        return _token_table(self._model, self.n_vocab)

    def close(self) -> None:
        self._model.close()


def _token_table(model: Model, n_vocab: int) -> TokenTable:
    vocab = model.vocab
    pieces, control = [], set()
    n_tokens = llama_cpp.llama_vocab_n_tokens(vocab)
    for token in range(n_vocab):
        if token >= n_tokens:
            pieces.append(b"")
            continue
        piece = model.piece(token, special=True)
        attr = llama_cpp.llama_token_get_attr(vocab, token)
        if attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL or (
                attr & llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
                and piece.startswith(b"<") and piece.endswith(b">")):
            control.add(token)
        pieces.append(piece)
    return TokenTable(tuple(pieces), frozenset(control), int(llama_cpp.llama_vocab_eos(vocab)))


def load(config: ModelConfig) -> LlamaBackend | IsolatedBackend:
    """The model as a backend; one spread over RPC workers runs in its own process, which a lost
    worker's abort takes down instead of Tandem (engine/isolated.py)."""
    if config.rpc:
        return IsolatedBackend(config, quiet_backend)
    return LlamaBackend(config)


def quiet_backend(config: ModelConfig) -> LlamaBackend:
    """The isolated backend's worker process: quiet llama.cpp there too, then load."""
    quiet_llama()
    return LlamaBackend(config)

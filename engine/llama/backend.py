"""The llama.cpp backend (engine/backend.py's interface) and a model file's tokenizer alone.

Logits are requested per row of a batch (llama_batch.logits flags) and copied only for those
rows, never for the whole batch: a 151,936-token vocabulary times n_ctx floats would cost
gigabytes. A context holds `n_seq` sequences in one unified KV cache (llama-server's slots);
a batch may hold several, each token tagged with its sequence id, and truncation uses
llama.cpp's memory API on one sequence. The model, the
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
from engine.backend import F32, ModelConfig, Part, TokenTable
from engine.errors import DecodeError, ModelFileError, SettingsError
from engine.isolated import IsolatedBackend
from engine.llama.compute_thread import COMPUTE
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
            # Loading computes too (llama.cpp repacks weights for this CPU under OpenMP): on
            # the compute thread, as every decode (compute_thread.py).
            self._model = self._owned.enter_context(
                COMPUTE.run(lambda: Model(path, n_gpu_layers=gpu_layers)))
            context = self._owned.enter_context(COMPUTE.run(lambda: Context(
                self._model, config.n_ctx, config.n_batch, threads, flash_attn=flash,
                kv_type=config.kv_type, n_seq=config.n_seq)))
            self.n_vocab: int = self._model.n_vocab
            # llama.cpp pads a small context up (16 became 256); the context asked for is the
            # limit the user set, so it is the one the engine keeps to.
            self.n_ctx: int = min(config.n_ctx, context.n_ctx)
            self.n_seq: int = config.n_seq
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
        return render_chat(template, messages, tools,
                           bos=model.text(llama_cpp.llama_vocab_bos(self._vocab)),
                           eos=model.text(llama_cpp.llama_vocab_eos(self._vocab)))

    def decode(self, tokens: Sequence[int], pos: int, rows: Sequence[int], seq: int = 0) -> F32:
        return self.decode_batch([Part(seq, tokens, pos, rows)])[0]

    def decode_batch(self, parts: Sequence[Part]) -> list[F32]:
        flat = [int(t) for part in parts for t in part.tokens]
        bad = [t for t in flat if not 0 <= t < self.n_vocab]
        if bad:
            raise SettingsError(f"token id {bad[0]} is outside the vocabulary of {self.name} "
                                f"({self.n_vocab} tokens)")
        b = self._batch.batch

        def fill(start: int, n: int) -> None:
            for j in range(n):
                b.token[j] = flat[start + j]

        return self._run(b, parts, fill)

    def decode_embeddings(self, embd: F32, pos: int, rows: Sequence[int], seq: int = 0) -> F32:
        """As `decode`, with input embeddings `[n, n_embd]` in place of token ids (a draft whose
        vocabulary was trimmed embeds tokens it no longer has; engine/trimmed_backend.py)."""
        return self.decode_embeddings_batch(embd, [Part(seq, range(len(embd)), pos, rows)])[0]

    def decode_embeddings_batch(self, embd: F32, parts: Sequence[Part]) -> list[F32]:
        """As `decode_batch`, with the parts' input embeddings laid end to end in `embd` (a
        part's `tokens` is only as long as its inputs)."""
        embd = np.ascontiguousarray(embd, dtype=np.float32)
        n = sum(len(p.tokens) for p in parts)
        if embd.ndim != 2 or embd.shape != (n, self.n_embd):
            raise SettingsError(f"embeddings must be [{n}, {self.n_embd}], got {embd.shape}")
        if self._embd_batch is None:
            self._embd_batch = self._owned.enter_context(Batch(self._n_batch, self.n_embd))
        b = self._embd_batch.batch
        base = ctypes.addressof(b.embd.contents)

        def fill(start: int, n: int) -> None:
            ctypes.memmove(base, embd[start:start + n].ctypes.data, n * self.n_embd * 4)

        return self._run(b, parts, fill)

    def _check(self, parts: Sequence[Part]) -> None:
        """Refuse what llama.cpp aborts or misbehaves on: a batch past a sequence's context, a
        sequence the cache does not hold or given twice, a logit row outside its part."""
        if len({p.seq for p in parts}) != len(parts):
            raise DecodeError(f"a batch holds sequence ids {[p.seq for p in parts]} more than once")
        for p in parts:
            n = len(p.tokens)
            if not 0 <= p.seq < self.n_seq:
                raise DecodeError(f"sequence {p.seq} is outside the {self.n_seq} the cache holds")
            if n < 1 or p.pos < 0 or p.pos + n > self.n_ctx:
                raise DecodeError(f"cannot decode {n} tokens at position {p.pos}: the context "
                                  f"holds {self.n_ctx}; raise --ctx")
            if any(not 0 <= r < n for r in p.rows):
                raise DecodeError(f"logit rows {list(p.rows)} are outside a batch of {n}")

    def _run(self, b, parts: Sequence[Part], fill: Callable[[int, int], None]) -> list[F32]:
        """Decode the parts' inputs, laid end to end, in chunks of n_batch (`fill(start, n)`
        writes a chunk's inputs into `b`) and copy the logits of each part's rows only."""
        self._check(parts)
        seqs: list[int] = []
        poss: list[int] = []
        # Where each wanted row lands: flat index -> (part, row of its output).
        want: dict[int, tuple[int, int]] = {}
        for k, p in enumerate(parts):
            base = len(seqs)
            for i, r in enumerate(p.rows):
                want[base + r] = (k, i)
            seqs += [p.seq] * len(p.tokens)
            poss += range(p.pos, p.pos + len(p.tokens))
        outs = [np.empty((len(p.rows), self.n_vocab), dtype=np.float32) for p in parts]
        n_total = len(seqs)
        for start in range(0, n_total, self._n_batch):
            n = min(self._n_batch, n_total - start)
            fill(start, n)
            for j in range(n):
                b.pos[j] = poss[start + j]
                b.n_seq_id[j] = 1
                b.seq_id[j][0] = seqs[start + j]
                b.logits[j] = start + j in want
            b.n_tokens = n
            # On the process's one compute thread: one OpenMP team (compute_thread.py).
            rc = COMPUTE.run(llama_cpp.llama_decode, self._ctx, b)
            if rc != 0:
                # The chunks before this one stay cached; the sessions truncate them away.
                raise DecodeError(f"llama.cpp could not decode {n} tokens at position "
                                  f"{poss[start]} (code {rc})")
            for j in range(n):
                got = want.get(start + j)
                if got is not None:
                    ptr = llama_cpp.llama_get_logits_ith(self._ctx, j)
                    outs[got[0]][got[1]] = np.ctypeslib.as_array(
                        ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))
        return outs

    def truncate(self, n: int, seq: int = 0) -> None:
        llama_cpp.llama_memory_seq_rm(self._mem, seq, n, -1)

    def close(self) -> None:
        # Safe to call twice: the stack is empty once it has run. Adapters, then batches, then
        # the model, the reverse of their making.
        self._owned.close()

    def __enter__(self) -> LlamaBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def render_chat(template: str, messages: Sequence[dict], tools: Sequence[dict] | None = None,
                bos: str = "", eos: str = "") -> str:
    """`messages` rendered by the chat template `template` (Jinja), ready for generation, as
    `LlamaBackend.chat_prompt` renders them with the model's own (a template read from a file's
    header renders the same without loading the model)."""
    fmt = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)
    # Plain dicts, which llama-cpp-python types as its message TypedDicts.
    # llama-cpp-python's formatter hands `tools` to the template as its `tools` variable.
    return fmt(messages=cast("list[Any]", list(messages)),
               tools=None if tools is None else cast("list[Any]", list(tools))).prompt


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

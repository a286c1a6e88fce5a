"""A backend run in a child process, so that llama.cpp aborting takes down only that child.

llama.cpp's RPC client calls abort() when a worker's connection breaks mid-call (ggml-rpc's
RPC_STATUS_ASSERT); in-process, that kills Tandem with the request. A model spread over RPC
workers is therefore loaded in a child process (multiprocessing "spawn": no llama.cpp state is
inherited) and driven through a pipe. When the child dies, the call in flight and every later
one raise `WorkerError` naming the workers that no longer answer; the app and the other models
stay up, and loading the model again starts a fresh child.

Cost: each decode ships its logit rows through the pipe (600 KB per row for a 151,936-token
vocabulary, about a millisecond), small beside a network round trip and a target forward.
Token pieces and end-of-generation flags are cached on this side.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from typing import Any, Callable, Sequence

from engine.backend import F32, ModelConfig, Part, TokenTable
from engine.errors import DecodeError, ModelFileError, TandemError
from engine.rpc import WorkerError, probe


def _child(conn, config: ModelConfig, make: Callable[[ModelConfig], Any]) -> None:
    # On abort, ggml attaches gdb to print a backtrace: seconds of noise for a lost worker.
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    try:
        backend = make(config)
    except TandemError as exc:
        conn.send(("err", exc))
        return
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("err", ModelFileError(f"llama.cpp could not load {config.path}: {exc}")))
        return
    conn.send(("ok", {"name": backend.name, "n_vocab": backend.n_vocab, "n_ctx": backend.n_ctx,
                      "n_batch": backend.n_batch, "n_seq": backend.n_seq}))
    while True:
        try:
            method, args = conn.recv()
        except EOFError:
            break
        if method == "close":
            backend.close()
            conn.send(("ok", None))
            break
        try:
            conn.send(("ok", getattr(backend, method)(*args)))
        except TandemError as exc:
            conn.send(("err", exc))
        except Exception as exc:  # noqa: BLE001 - the parent raises it as a one-line error
            conn.send(("err", DecodeError(f"{backend.name}: {type(exc).__name__}: {exc}")))


class IsolatedBackend:
    """The Backend interface of the backend `make(config)` builds in a child process (`make`
    is passed by reference: engine.llama.backend.LlamaBackend, imported there)."""

    def __init__(self, config: ModelConfig, make: Callable[[ModelConfig], Any]) -> None:
        self.config = config
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_child, args=(child_conn, config, make), daemon=True,
                                 name="tandem-rpc-model")
        self._proc.start()
        child_conn.close()
        self._dead: WorkerError | None = None
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._token_table: TokenTable | None = None
        try:
            info = self._reply("load")
        except BaseException:
            self._proc.join(timeout=5)
            raise
        self.name: str = info["name"]
        self.n_vocab: int = info["n_vocab"]
        self.n_ctx: int = info["n_ctx"]
        self.n_batch: int = info["n_batch"]
        self.n_seq: int = info["n_seq"]

    def _lost(self, doing: str) -> WorkerError:
        self._proc.join(timeout=5)
        code = self._proc.exitcode
        down = []
        for endpoint in self.config.rpc:
            try:
                probe(endpoint, timeout=1.0)
            except WorkerError:
                down.append(endpoint)
        who = ", ".join(down or self.config.rpc)
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return WorkerError(f"lost RPC worker {who} while {doing}: llama.cpp ended the model's "
                           f"process ({how}); restart the worker and load the model again")

    def _reply(self, doing: str) -> Any:
        try:
            status, value = self._conn.recv()
        except (EOFError, OSError):
            self._dead = self._lost(doing)
            raise self._dead from None
        if status == "err":
            raise value
        return value

    def _call(self, method: str, *args: Any) -> Any:
        if self._dead is not None:
            raise self._dead
        try:
            self._conn.send((method, args))
        except (BrokenPipeError, OSError):
            self._dead = self._lost(f"calling {method}")
            raise self._dead from None
        return self._reply(f"running {method}")

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self._call("tokenize", text, add_special, parse_special)

    def token_bytes(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._call("token_bytes", token)
        return piece

    def is_eog(self, token: int) -> bool:
        flag = self._eog.get(token)
        if flag is None:
            flag = self._eog[token] = self._call("is_eog", token)
        return flag

    def token_table(self) -> TokenTable:
        if self._token_table is None:
            self._token_table = self._call("token_table")
        return self._token_table

    def metadata(self) -> dict[str, str]:
        return self._call("metadata")

    def chat_prompt(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str:
        return self._call("chat_prompt", list(messages), None if tools is None else list(tools))

    def decode(self, tokens: Sequence[int], pos: int, rows: Sequence[int], seq: int = 0) -> F32:
        return self._call("decode", [int(t) for t in tokens], int(pos), [int(r) for r in rows],
                          int(seq))

    def decode_batch(self, parts: Sequence[Part]) -> list[F32]:
        return self._call("decode_batch", [Part(p.seq, [int(t) for t in p.tokens], p.pos,
                                                [int(r) for r in p.rows]) for p in parts])

    def truncate(self, n: int, seq: int = 0) -> None:
        # A dead child has no cache left to truncate; the error that killed it is the one to see.
        if self._dead is None:
            self._call("truncate", n, seq)

    def close(self) -> None:
        if self._dead is None and self._proc.is_alive():
            try:
                self._conn.send(("close", ()))
                self._conn.recv()
            except (EOFError, OSError):
                pass
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()
        self._dead = self._dead or WorkerError(f"{self.name} was closed")

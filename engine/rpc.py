"""RPC workers (llama.cpp's rpc-server, started by `tandem worker`): addresses and a probe.

llama.cpp's RPC client aborts the whole process when it cannot connect to a worker or the
handshake fails, so every worker is probed here first, in plain Python: a TCP connect, the
protocol's HELLO (version check) and its device-memory query. A worker that refuses, times out
or speaks another protocol version becomes a one-line `WorkerError` naming it. The probe also
reads each worker's free memory, which decides how llama.cpp splits the layers.

rpc-server serves one client at a time: a worker busy with another Tandem answers nothing to
the HELLO, and the probe says so.
"""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Sequence

from engine.errors import SettingsError, TandemError

DEFAULT_PORT = 50052
# ggml-rpc.h of the llama.cpp vendored by llama-cpp-python 0.3.36 (scripts/lib.sh pins it).
PROTO_MAJOR = 7
PROTO_MINOR = 0
CMD_GET_DEVICE_MEMORY = 11
CMD_HELLO = 14
CMD_DEVICE_COUNT = 15
CONN_CAPS_SIZE = 24  # ggml-rpc/transport.h; all zero: plain TCP, no transport upgrade
PROBE_TIMEOUT_S = 5.0


class WorkerError(TandemError):
    """An RPC worker is unreachable, busy, of another version, or was lost mid-generation."""


@dataclass(frozen=True)
class WorkerInfo:
    endpoint: str
    devices: int
    free: int  # bytes, summed over the worker's devices
    total: int


def parse_endpoints(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """`HOST:PORT[,HOST:PORT...]` (a list of such strings too) to normalised endpoints; the
    port defaults to 50052, rpc-server's own default. Repeats are refused: llama.cpp would
    register one worker twice."""
    if not text:
        return ()
    parts = [text] if isinstance(text, str) else list(text)
    out: list[str] = []
    for item in ",".join(parts).split(","):
        item = item.strip()
        if not item:
            raise SettingsError(f"empty worker address in {text!r}; use HOST:PORT[,HOST:PORT...]")
        host, sep, port = item.rpartition(":")
        if not sep:
            host, port = item, str(DEFAULT_PORT)
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SettingsError(f"bad worker address {item!r}; use HOST:PORT, e.g. 192.168.1.20:50052")
        endpoint = f"{host}:{int(port)}"
        if endpoint in out:
            raise SettingsError(f"worker {endpoint} is listed twice")
        out.append(endpoint)
    return tuple(out)


def _split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed the connection")
        data += chunk
    return data


def _call(sock: socket.socket, cmd: int, payload: bytes, out_size: int) -> bytes:
    # Request: cmd (1 byte) | size (u64) | payload; response: size (u64) | data.
    sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
    if size != out_size:
        raise ConnectionError(f"answered {size} bytes where {out_size} were expected")
    return _recv_exact(sock, size)


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> WorkerInfo:
    """Connect, shake hands and read the worker's memory, or raise WorkerError naming it."""
    host, port = _split(endpoint)
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise WorkerError(f"RPC worker {endpoint} is unreachable ({exc.strerror or exc}); start "
                          f"it with `tandem worker --host {host} --port {port}` on that machine") from None
    try:
        with sock:
            try:
                rsp = _call(sock, CMD_HELLO, bytes(CONN_CAPS_SIZE), 4 + CONN_CAPS_SIZE)
            except socket.timeout:
                raise WorkerError(f"RPC worker {endpoint} did not answer the handshake within "
                                  f"{timeout:.0f} s: it is serving another client (a worker "
                                  "takes one at a time) or is not an rpc-server") from None
            major, minor, patch = rsp[0], rsp[1], rsp[2]
            if major != PROTO_MAJOR or minor > PROTO_MINOR:
                raise WorkerError(f"RPC worker {endpoint} speaks protocol {major}.{minor}.{patch}, "
                                  f"this Tandem {PROTO_MAJOR}.{PROTO_MINOR}; start it with this "
                                  "Tandem's `tandem worker`")
            (count,) = struct.unpack("<I", _call(sock, CMD_DEVICE_COUNT, b"", 4))
            free = total = 0
            for dev in range(count):
                f, t = struct.unpack("<QQ", _call(sock, CMD_GET_DEVICE_MEMORY,
                                                  struct.pack("<I", dev), 16))
                free, total = free + f, total + t
    except (OSError, ConnectionError) as exc:
        raise WorkerError(f"RPC worker {endpoint} failed the handshake ({exc}); is it an "
                          "rpc-server started by `tandem worker`?") from None
    return WorkerInfo(endpoint, count, free, total)


def probe_all(endpoints: Sequence[str], timeout: float = PROBE_TIMEOUT_S) -> list[WorkerInfo]:
    return [probe(e, timeout) for e in endpoints]

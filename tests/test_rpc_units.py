"""RPC workers without a real worker: addresses, the probe against scripted servers, the layer
split the budget shows, the rpc-server lookup and `tandem worker`'s command line."""
from __future__ import annotations

import argparse
import socket
import struct
import threading

import pytest

from app.settings import rpc_workers
from app.worker_cli import worker_command
from engine.backend import ModelConfig
from engine.errors import DoesNotFitError, SettingsError
from loading.options import LoadOptions
from loading.plan import plan_load
from engine.rpc import (CMD_DEVICE_COUNT, CMD_GET_DEVICE_MEMORY, CMD_HELLO, CONN_CAPS_SIZE,
                        WorkerError, WorkerInfo, parse_endpoints, probe)
from models import budget
from models.budget import MIB, Layout, worker_split
from models.rpc_server import WorkerBuildError, find_rpc_server
from tests import tinygguf


def test_parse_endpoints():
    assert parse_endpoints("10.0.0.2:50052,host-b:6000") == ("10.0.0.2:50052", "host-b:6000")
    assert parse_endpoints("box") == ("box:50052",)
    assert parse_endpoints(["a:1", "b:2"]) == ("a:1", "b:2")
    assert parse_endpoints(None) == ()
    for bad in ("a:x", "a:0", "a:70000", ":5", "a:1,,b:2"):
        with pytest.raises(SettingsError):
            parse_endpoints(bad)
    with pytest.raises(SettingsError, match="listed twice"):
        parse_endpoints("a:1,a:1")


def test_target_and_draft_workers_must_differ():
    args = argparse.Namespace(rpc="a:1,b:2", draft_rpc="b:2")
    with pytest.raises(SettingsError, match="b:2 is in both"):
        rpc_workers(args)
    assert rpc_workers(argparse.Namespace(rpc="a:1", draft_rpc=None)) == (("a:1",), ())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_worker_is_named():
    port = _free_port()
    with pytest.raises(WorkerError, match=f"RPC worker 127.0.0.1:{port} is unreachable"):
        probe(f"127.0.0.1:{port}", timeout=1)


class ScriptedWorker:
    """A TCP server answering HELLO (with `version`), DEVICE_COUNT and GET_DEVICE_MEMORY as
    rpc-server does, or nothing at all when `silent`."""

    def __init__(self, version=(7, 0, 0), free=(3 << 30,), silent=False):
        self.version, self.free, self.silent = version, free, silent
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _recv(self, conn, n):
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise ConnectionError
            data += chunk
        return data

    def _serve(self):
        conn, _ = self.sock.accept()
        with conn:
            try:
                while True:
                    cmd, size = struct.unpack("<BQ", self._recv(conn, 9))
                    payload = self._recv(conn, size)
                    if self.silent:
                        continue
                    if cmd == CMD_HELLO:
                        assert size == CONN_CAPS_SIZE
                        out = bytes([*self.version, 0]) + bytes(CONN_CAPS_SIZE)
                    elif cmd == CMD_DEVICE_COUNT:
                        out = struct.pack("<I", len(self.free))
                    elif cmd == CMD_GET_DEVICE_MEMORY:
                        (dev,) = struct.unpack("<I", payload)
                        out = struct.pack("<QQ", self.free[dev], 2 * self.free[dev])
                    conn.sendall(struct.pack("<Q", len(out)) + out)
            except ConnectionError:
                pass

    def close(self):
        self.sock.close()


def test_probe_reads_devices_and_memory():
    w = ScriptedWorker(free=(1 << 30, 2 << 30))
    try:
        info = probe(w.endpoint, timeout=5)
    finally:
        w.close()
    assert info == WorkerInfo(w.endpoint, 2, 3 << 30, 6 << 30)


def test_probe_refuses_another_protocol_version():
    w = ScriptedWorker(version=(3, 0, 0))
    try:
        with pytest.raises(WorkerError, match=r"speaks protocol 3\.0\.0"):
            probe(w.endpoint, timeout=5)
    finally:
        w.close()


def test_probe_names_a_busy_worker():
    w = ScriptedWorker(silent=True)
    try:
        with pytest.raises(WorkerError, match="serving another client"):
            probe(w.endpoint, timeout=0.5)
    finally:
        w.close()


def _layout(n_layer=4, layer=100 * MIB, output=50 * MIB) -> Layout:
    return Layout("t.gguf", n_layer, 64, 4, 2, 16, 16, 1000, (layer,) * n_layer, (0,) * n_layer,
                  output, 0, 10 * MIB)


def test_worker_split_follows_free_memory_like_llama_cpp():
    # Five slots (4 blocks + output), split points 0.5 and 1.0: slot il goes to the first worker
    # whose cumulative share exceeds il / 5, so 0,1,2 -> a and 3, output -> b.
    a, b = WorkerInfo("a:1", 1, 4 << 30, 8 << 30), WorkerInfo("b:1", 1, 4 << 30, 8 << 30)
    sa, sb = worker_split(_layout(), [a, b], n_ctx=256)
    assert (sa.first, sa.last, sb.first, sb.last) == (0, 3, 3, 5)
    assert sa.weights == 300 * MIB and sb.weights == 150 * MIB
    assert sa.kv == 3 * sb.kv > 0
    assert "layers 0-2" in sa.describe() and "layers 3-3 + output" in sb.describe()
    # A worker with three times the memory gets the larger run.
    big = WorkerInfo("a:1", 1, 12 << 30, 16 << 30)
    sa, sb = worker_split(_layout(), [big, b], n_ctx=256)
    assert (sa.last - sa.first, sb.last - sb.first) == (4, 1)


def test_budget_checks_each_worker(tmp_path):
    path = tinygguf.write(tmp_path / "t.gguf", n_layer=4, pad_bytes=8 * MIB)
    roomy = [WorkerInfo("a:1", 1, 4 << 30, 8 << 30), WorkerInfo("b:1", 1, 4 << 30, 8 << 30)]
    report = budget.estimate_rpc(path, None, roomy, n_ctx=256)
    assert report.ok and len(report.workers) == 2
    assert "worker a:1: layers" in report.text()
    # A worker with little memory gets few layers, so only short workers fail the check.
    tiny = [WorkerInfo("a:1", 1, 1000, 8 << 30), WorkerInfo("b:1", 1, 1000, 8 << 30)]
    report = budget.estimate_rpc(path, None, tiny, n_ctx=256)
    assert not report.ok
    assert "more or larger workers: worker a:1" in report.suggestions[0]


def test_loading_probes_the_workers_before_the_budget(tmp_path):
    path = tinygguf.write(tmp_path / "t.gguf", n_layer=2)
    port = _free_port()
    cfg = ModelConfig(str(path), n_ctx=256, rpc=(f"127.0.0.1:{port}",))
    with pytest.raises(WorkerError, match=f"127.0.0.1:{port} is unreachable"):
        plan_load(cfg, None, LoadOptions())
    w = ScriptedWorker(free=(100,))
    try:
        cfg = ModelConfig(str(path), n_ctx=256, rpc=(w.endpoint,))
        with pytest.raises(DoesNotFitError, match=f"worker {w.endpoint}"):
            plan_load(cfg, None, LoadOptions())
    finally:
        w.close()


def test_find_rpc_server_matches_the_installed_library(tmp_path, monkeypatch):
    monkeypatch.delenv("TANDEM_RPC_SERVER", raising=False)
    lib = tmp_path / "site" / "lib"
    lib.mkdir(parents=True)
    (lib / "libggml-rpc.so").write_bytes(b"build B")
    for key, content in (("aaa", b"build A"), ("bbb", b"build B")):
        d = tmp_path / "home" / "wheels" / f"llama-cpp-{key}" / "rpc-server"
        d.mkdir(parents=True)
        (d / "rpc-server").write_bytes(b"")
        (d / "libggml-rpc.so").write_bytes(content)
    found = find_rpc_server(tmp_path / "home", lib)
    assert found.parent.parent.name == "llama-cpp-bbb"
    (lib / "libggml-rpc.so").write_bytes(b"build C")
    with pytest.raises(WorkerBuildError, match="run scripts/run"):
        find_rpc_server(tmp_path / "home", lib)
    with pytest.raises(WorkerBuildError, match="no RPC backend"):
        find_rpc_server(tmp_path / "home", tmp_path / "nowhere")


def test_worker_command_line(monkeypatch, tmp_path):
    exe = tmp_path / "rpc-server"
    exe.write_bytes(b"")
    monkeypatch.setenv("TANDEM_RPC_SERVER", str(exe))
    args = argparse.Namespace(host="10.0.0.2", port=6000, threads=3)
    assert worker_command(args) == [str(exe), "--host", "10.0.0.2", "--port", "6000",
                                    "--threads", "3"]
    with pytest.raises(SettingsError, match="port"):
        worker_command(argparse.Namespace(host="127.0.0.1", port=0, threads=None))
    monkeypatch.setenv("TANDEM_RPC_SERVER", str(tmp_path / "missing"))
    with pytest.raises(WorkerBuildError):
        worker_command(args)


def test_budget_command_shows_each_worker(tmp_path, capsys):
    from app.cli import main
    path = tinygguf.write(tmp_path / "t.gguf", n_layer=4)
    w = ScriptedWorker(free=(4 << 30,))
    try:
        rc = main(["budget", "--target", str(path), "--ctx", "256", "--rpc", w.endpoint])
    finally:
        w.close()
    out = capsys.readouterr().out
    assert rc == 0
    assert f"worker {w.endpoint}: layers 0-3 + output" in out

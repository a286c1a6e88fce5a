"""One machine standing in for several: RPC workers in their own network namespaces, with a
round-trip delay in front of each (test and benchmark tooling, not part of Tandem).

Each worker runs `tandem worker` inside namespace `tandem-wN`, joined to the host by a veth pair
on 10.201.N.0/24 (host .1, worker .2). The delay: netem is the usual tool, but this machine's
kernel has no sch_netem ("Specified qdisc kind is unknown") and cannot load modules, so a
userspace TCP proxy on the host side of each veth holds every chunk for RTT/2 in each direction
before forwarding it, in order. ggml-rpc is request/response over one TCP connection, so a
propagation delay is what it sees from netem too; the proxy adds no bandwidth limit (veth has
none worth noting) and its own overhead is measured at 0 ms against a direct connection.

`Lab` sets all of it up and tears every namespace and process down in `close()`, which its
context manager and an atexit hook always call.
"""
from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PORT = 50052
_LABS = 0  # labs started by this process


def _interrupt(*_) -> None:
    raise KeyboardInterrupt("SIGTERM")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def namespaces_allowed() -> str | None:
    """None when namespaces and veth pairs can be made here, else why not."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing"
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"tandem-probe{os.getpid()}"
    r = _ip("netns", "add", name, check=False)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


class DelayProxy:
    """TCP proxy delaying each direction by `delay_s` (RTT/2), settable while it runs."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int]) -> None:
        self.listen, self.upstream = listen, upstream
        self.delay_s = 0.0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="delay-proxy")
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the delay proxy did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._client, *self.listen))
        self._ready.set()
        self._loop.run_forever()

    async def _pipe(self, reader, writer) -> None:
        queue: asyncio.Queue = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if data is None:
                    break
                wait = due - self._loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.ensure_future(send())
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                queue.put_nowait((self._loop.time() + self.delay_s, data))
        finally:
            queue.put_nowait((0.0, None))
            await sender

    async def _client(self, reader, writer) -> None:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        up_writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer),
                             return_exceptions=True)

    def close(self) -> None:
        def stop() -> None:
            self._server.close()
            self._loop.stop()
        self._loop.call_soon_threadsafe(stop)
        self._thread.join(timeout=5)


class Lab:
    """`n` workers in namespaces, each reachable directly (`direct[i]`) and through a delay
    proxy (`proxied[i]`, delay set with `set_rtt_ms`)."""

    def __init__(self, n: int = 2, threads: int = 1, python: str = sys.executable) -> None:
        self.n, self.threads, self.python = n, threads, python
        self.procs: list[subprocess.Popen] = []
        self.proxies: list[DelayProxy] = []
        self.names: list[str] = []
        self.links: list[str] = []
        self.direct: list[str] = []
        self.proxied: list[str] = []
        self.logs: list[Path] = []
        atexit.register(self.close)

    def __enter__(self) -> "Lab":
        # A plain SIGTERM would end the process without `finally` blocks or atexit hooks.
        if threading.current_thread() is threading.main_thread():
            self._old_term = signal.signal(signal.SIGTERM, _interrupt)
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        if getattr(self, "_old_term", None) is not None:
            signal.signal(signal.SIGTERM, self._old_term)

    def start(self) -> None:
        global _LABS
        _LABS += 1
        pid, tag = os.getpid(), os.getpid() % 200 + 20
        for i in range(self.n):
            # Unique per process and lab, so labs may overlap (a test's own beside a module's).
            name, net = f"tandem-w{pid}-{_LABS}-{i}", f"10.{tag}.{_LABS % 25 * 10 + i + 1}"
            host_if, ns_if = f"tw{pid % 100000}{_LABS % 100}h{i}", f"tw{pid % 100000}{_LABS % 100}n{i}"
            _ip("netns", "add", name)
            self.names.append(name)
            _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
            self.links.append(host_if)
            _ip("link", "set", ns_if, "netns", name)
            _ip("addr", "add", f"{net}.1/24", "dev", host_if)
            _ip("link", "set", host_if, "up")
            _ip("-n", name, "addr", "add", f"{net}.2/24", "dev", ns_if)
            _ip("-n", name, "link", "set", ns_if, "up")
            _ip("-n", name, "link", "set", "lo", "up")
            log = Path(os.environ.get("TMPDIR", "/tmp")) / f"{name}.log"
            self.logs.append(log)
            cmd = ["ip", "netns", "exec", name, self.python, "-m", "app.cli", "worker",
                   "--host", f"{net}.2", "--port", str(PORT), "--threads", str(self.threads)]
            with open(log, "w") as fh:
                self.procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                                   start_new_session=True))
            self.direct.append(f"{net}.2:{PORT}")
            proxy = DelayProxy((f"{net}.1", 0), (f"{net}.2", PORT))
            self.proxies.append(proxy)
            self.proxied.append(f"{net}.1:{proxy._server.sockets[0].getsockname()[1]}")
        for endpoint, proc, log in zip(self.direct, self.procs, self.logs):
            self._wait_listening(endpoint, proc, log)

    @staticmethod
    def _wait_listening(endpoint: str, proc: subprocess.Popen, log: Path) -> None:
        host, port = endpoint.rsplit(":", 1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"worker {endpoint} exited: {log.read_text()[-500:]}")
            try:
                # rpc-server takes the connection, finds no HELLO and waits for the next client.
                socket.create_connection((host, int(port)), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"worker {endpoint} did not start: {log.read_text()[-500:]}")

    def set_rtt_ms(self, rtt_ms: float) -> None:
        for p in self.proxies:
            p.delay_s = rtt_ms / 2000.0

    def kill_worker(self, i: int) -> None:
        proc = self.procs[i]
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=10)

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.close()
        self.proxies.clear()
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)
        self.procs.clear()
        for link in self.links:
            _ip("link", "del", link, check=False)  # and its peer with it
        self.links.clear()
        for name in self.names:
            _ip("netns", "del", name, check=False)
        self.names.clear()

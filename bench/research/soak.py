"""Soak (issue 38): many requests through one `tandem serve` on the embedded pair, watching the
server process for leaks. Short answers (4-16 tokens), mixed settings: every drafter the pair
offers and every policy, temperatures 0 / 0.7 / 1, stop strings, chat and raw completions,
streamed and not, streams the client closes after the first event, and every 100 requests a
burst of the server's slots + --max-queue + 3 concurrent requests (some of which the full queue
answers 503).

Every --every requests it records the server's RSS, open file descriptors, the history file's
size and tokens, and p50/p99 latency of the sequential requests in that stretch. Pass: RSS grows
less than 5% after the first 100 requests, descriptors stay flat (+2 at most), no 5xx apart from
the bursts' 503s, no traceback in the log, and the history within --history-tokens.

  .venv/bin/python -m bench.research.soak [--requests 1000] [--out DIR]

Writes DIR/soak.json, DIR/table.md and DIR/soak.png; exits 1 when a criterion fails.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from engine.control.registry import POLICIES

PROMPTS = [
    "Write a Python function that reverses a string.",
    "What does HTTP status 503 mean?",
    "Explain a Python list comprehension in one sentence.",
    "Write a SQL query that counts the rows of a table named users.",
    "def fibonacci(n):",
    "Name three sorting algorithms.",
    "Write a bash loop over the files in a folder.",
    "What is a mutex?",
    "Convert this to JSON: name Ada, born 1815.",
    "import numpy as np\n# the mean of an array a\n",
]
STOPS = ["\n\n", "```", ".", "def"]
KEY = "sk-tandem-soak"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def history_figures(root: Path) -> tuple[int, int]:
    """Bytes of every history file, and the most tokens one holds (separators included, as the
    budget counts them)."""
    size = most = 0
    for path in root.rglob("*.npz"):
        size += path.stat().st_size
        with np.load(path, allow_pickle=False) as f:
            most = max(most, len(f["tokens"]))
    return size, most


class Soak:
    def __init__(self, url: str, drafters: list[str], seed: int) -> None:
        self.url = url
        self.drafters = drafters
        self.rng = random.Random(seed)
        self.client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"},
                                   timeout=300)
        self.statuses: dict[int, int] = {}
        self.burst_statuses: dict[int, int] = {}
        self.latencies: list[float] = []
        self.cancelled = 0

    def body(self) -> tuple[str, dict]:
        rng = self.rng
        chat = rng.random() < 0.8
        prompt = rng.choice(PROMPTS)
        body: dict = ({"messages": [{"role": "user", "content": prompt}]} if chat
                      else {"prompt": prompt})
        body["max_tokens"] = rng.randint(4, 16)
        body["temperature"] = rng.choice([0.0, 0.0, 0.7, 1.0])
        if body["temperature"] and rng.random() < 0.5:
            body["top_p"] = 0.9
        if rng.random() < 0.2:
            body["stop"] = rng.choice(STOPS)
        body["seed"] = rng.randrange(1 << 31)
        drafter = rng.choice(self.drafters)
        spec: dict = {"drafter": drafter}
        if drafter != "plain":
            spec["policy"] = rng.choice(POLICIES)
        body["speculative"] = spec
        return ("/v1/chat/completions" if chat else "/v1/completions"), body

    def one(self, path: str, body: dict, cancel: bool = False) -> int:
        if body.get("stream"):
            with self.client.stream("POST", path, json=body) as r:
                if cancel and r.status_code == 200:
                    next(r.iter_lines(), None)  # the first event, then close the stream
                    self.cancelled += 1
                else:
                    r.read()
                return r.status_code
        return self.client.post(path, json=body).status_code

    def sequential(self) -> None:
        path, body = self.body()
        cancel = False
        if self.rng.random() < 0.4:
            body["stream"] = True
            cancel = self.rng.random() < 0.25
        t0 = time.perf_counter()
        status = self.one(path, body, cancel)
        if not cancel:
            self.latencies.append(time.perf_counter() - t0)
        self.statuses[status] = self.statuses.get(status, 0) + 1

    def burst(self, n: int) -> int:
        bodies = [self.body() for _ in range(n)]
        out: list[int] = []

        def send(path: str, body: dict) -> None:
            out.append(self.one(path, body))

        threads = [threading.Thread(target=send, args=pb) for pb in bodies]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for status in out:
            self.burst_statuses[status] = self.burst_statuses.get(status, 0) + 1
        return n


def start_server(args: argparse.Namespace, tmp: Path) -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    key_file = tmp / "key.txt"
    key_file.write_text(KEY + "\n")
    log = tmp / "serve.log"
    env = {**os.environ, "TANDEM_HISTORY": str(tmp / "history")}
    argv = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--api-key-file",
            str(key_file), "--max-queue", str(args.max_queue), "--ctx", str(args.ctx),
            "--threads", str(args.threads), "--history-tokens", str(args.history_tokens)]
    if args.parallel is not None:
        argv += ["--parallel", str(args.parallel)]
    with open(log, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"tandem serve exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise SystemExit("tandem serve did not load the pair within 10 minutes")


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def run(args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="tandem-soak-"))
    proc, url, log = start_server(args, tmp)
    checkpoints: list[dict] = []
    try:
        drafters = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"},
                             timeout=30).json()["data"][0]["drafters"]
        soak = Soak(url, drafters, args.seed)
        # A burst outnumbers the slots and the queue by 3, so the full queue answers some 503.
        parallel = httpx.get(f"{url}/health", timeout=30).json()["queue"]["parallel"]
        sent, t_start, mark = 0, time.perf_counter(), 0
        while sent < args.requests and time.perf_counter() - t_start < args.minutes * 60:
            if sent % args.every == args.every // 2 and args.burst:
                sent += soak.burst(parallel + args.max_queue + 3)
            soak.sequential()
            sent += 1
            out_of_time = time.perf_counter() - t_start >= args.minutes * 60
            if sent // args.every > len(checkpoints) or sent >= args.requests or out_of_time:
                lat = soak.latencies[mark:]
                mark = len(soak.latencies)
                hist_bytes, hist_tokens = history_figures(tmp / "history")
                checkpoints.append({
                    "requests": sent, "seconds": round(time.perf_counter() - t_start, 1),
                    "rss_mib": round(rss_kib(proc.pid) / 1024, 1), "fds": open_fds(proc.pid),
                    "history_bytes": hist_bytes, "history_tokens": hist_tokens,
                    "p50_s": round(percentile(lat, 50), 3), "p99_s": round(percentile(lat, 99), 3)})
                print(json.dumps(checkpoints[-1]), flush=True)
        after = httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                           json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                           timeout=120).status_code
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    text = log.read_text(errors="replace")
    return {"requests": sent, "checkpoints": checkpoints, "statuses": soak.statuses,
            "burst_statuses": soak.burst_statuses, "cancelled_streams": soak.cancelled,
            "answer_after": after, "tracebacks": text.count("Traceback"), "parallel": parallel,
            "settings": {k: v for k, v in vars(args).items() if k != "out"},
            "cpu": cpu_name()}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f", {os.cpu_count()} cores"
    except OSError:
        pass
    return "unknown"


def verdict(r: dict, budget: int) -> dict[str, bool]:
    cps = r["checkpoints"]
    # The base: the first checkpoint after 100 requests (the pair's calibrations done).
    at = next((i for i, c in enumerate(cps) if c["requests"] >= 100), 0)
    base = cps[at]
    later = cps[at + 1:] or [base]
    server_errors = sum(c for s, c in r["statuses"].items() if int(s) >= 500)
    burst_errors = sum(c for s, c in r["burst_statuses"].items() if int(s) >= 500 and int(s) != 503)
    return {
        "rss grows < 5% after the first 100 requests":
            max(c["rss_mib"] for c in later) < 1.05 * base["rss_mib"],
        "descriptors flat (+2 at most)": max(c["fds"] for c in later) <= base["fds"] + 2,
        "no 5xx but the bursts' 503s": server_errors == 0 and burst_errors == 0,
        "no traceback in the log": r["tracebacks"] == 0,
        "history within its budget": max(c["history_tokens"] for c in cps) <= budget,
        "answers after the soak": r["answer_after"] == 200,
    }


def table(r: dict, checks: dict[str, bool]) -> str:
    lines = ["| requests | seconds | RSS MiB | open fds | history KiB | history tokens | p50 s | p99 s |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in r["checkpoints"]:
        lines.append(f"| {c['requests']} | {c['seconds']} | {c['rss_mib']} | {c['fds']} | "
                     f"{c['history_bytes'] / 1024:.0f} | {c['history_tokens']} | {c['p50_s']} | "
                     f"{c['p99_s']} |")
    lines += ["", f"{r['requests']} requests of the {r['settings']['requests']} asked for"
              + (f" (stopped after {r['settings']['minutes']:g} minutes)"
                 if r["requests"] < r["settings"]["requests"] else "") + ".",
              "", f"Statuses of the sequential requests: {r['statuses']}; of the bursts: "
              f"{r['burst_statuses']}; streams closed after the first event: "
              f"{r['cancelled_streams']}. Server slots (--parallel): {r.get('parallel', 1)}. "
              f"CPU: {r['cpu']}.", ""]
    lines += [f"- {'pass' if ok else 'FAIL'}: {name}" for name, ok in checks.items()]
    return "\n".join(lines) + "\n"


def plot(r: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cps = r["checkpoints"]
    x = [c["requests"] for c in cps]
    fig, axes = plt.subplots(1, 3, figsize=(10, 2.8))
    axes[0].plot(x, [c["rss_mib"] for c in cps], marker="o")
    axes[0].set_title("server RSS (MiB)")
    axes[0].set_ylim(0, max(c["rss_mib"] for c in cps) * 1.1)
    axes[1].plot(x, [c["fds"] for c in cps], marker="o", label="open fds")
    axes[1].plot(x, [c["history_bytes"] / 1024 for c in cps], marker="s", label="history KiB")
    axes[1].set_title("descriptors, history")
    axes[1].legend(fontsize=7)
    axes[2].plot(x, [c["p50_s"] for c in cps], marker="o", label="p50")
    axes[2].plot(x, [c["p99_s"] for c in cps], marker="s", label="p99")
    axes[2].set_title("latency (s)")
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.set_xlabel("requests")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--max-queue", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=None,
                    help="the server's slots (default: serve's own)")
    ap.add_argument("--no-burst", dest="burst", action="store_false")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--history-tokens", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=38)
    ap.add_argument("--minutes", type=float, default=float("inf"),
                    help="stop after this long even if fewer requests were sent (said in the table)")
    ap.add_argument("--out", type=Path, default=Path("docs/results/latest/soak"))
    args = ap.parse_args(argv)
    r = run(args)
    checks = verdict(r, args.history_tokens)
    r["checks"] = checks
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(r, indent=1))
    (args.out / "table.md").write_text(table(r, checks))
    plot(r, args.out / "soak.png")
    print(table(r, checks))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""llama.cpp's own llama-server beside `tandem serve`, as a benchmark of the project (issue 62):
the same target (the embedded Qwen2.5-Coder-1.5B Q4_K_M), prompts (whole-file edits), machine
and sampling (greedy, chat requests, one slot each, the same threads and context), interleaved.

  .venv/bin/python -m bench.llama_server_peer --llama-server PATH [--prompts FILE] [--limit N]
      [--max-tokens 256] [--repeats 2] [--configs NAME,...] [--out DIR]

`scripts/benchmarks peer` builds llama-server (scripts/lib.sh `ensure_llama_server`) and runs it.

Configurations: llama-server plain, `ngram-mod` at its docs' settings (docs/speculative.md),
`ngram-map-k`, `draft-simple` with the embedded draft (`-md`); Tandem plain, its default, prompt
lookup, and its default with the request's own file as OpenAI's `prediction` (a server that does
not take the field answers 400: that configuration is recorded as refused and the run goes on).

Order: for each prompt, every configuration in turn; each repeat of the prompt runs them in the
reverse order of the one before, so a drift of the machine weighs on all alike. One server
decodes at a time: a llama-server is started for each request and stopped after it (so ngram-mod's
hash pool, which llama-server shares across requests, holds only that request's prompt and
answer: no history, as Tandem runs with --no-history), and one `tandem serve` serves the Tandem
configurations that come together in the order, stopped before a llama-server starts. Each
server gets one short request on an unrelated prompt before it is measured (Tandem's: one per
configuration, so its calibrations are done).

What the figures measure, decode only, prompt processing excluded:
- llama-server: `timings.predicted_per_second`, (predicted_n - 1) / predicted_ms: generated
  tokens after the first (whose logits come from the prompt's batch) over the time from the
  first generated token to the last.
- Tandem: `speculative.tokens_per_s`, completion tokens / decode_ms, from the end of the prefill
  (the prompt but its last token, which the first round decodes) to the last committed token.
Both are output tokens per second of decode steps. Acceptance: drafted tokens accepted, over the
drafted tokens (llama-server `timings.draft_n_accepted` / `draft_n`; Tandem
`speculative.accepted_tokens` / `drafted_tokens`), summed over the configuration's answers.
Speedup: per prompt, a configuration's median rate over its repeats divided by its own server's
plain median rate on that prompt; then the median and the 10th percentile over the prompts.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import httpx
import numpy as np

from bench.benchmark.suite import SuitePrompt, load_suite
from bench.research.soak import free_port
from models.embedded import DRAFT, TARGET

LLAMA, TANDEM = "llama-server", "tandem"
# Stands for the draft GGUF's path in a llama-server configuration's flags.
DRAFT_ARG = "{draft}"
DEFAULT_PROMPTS = Path(__file__).resolve().parents[1] / "assets" / "prompts" / "file-edits-v1.jsonl"
WARMUP = SuitePrompt("warm-up", "warm-up", "Fix the typo. Reply with the complete file only.\n\n"
                     "```python\ndef add(a, b):\n    retrun a + b\n```")
WARMUP_TOKENS = 8
# The first fenced block of a prompt, fences included: the file a whole-file edit sends back.
FENCED = re.compile(r"^```[^\n]*\n.*?^```[ \t]*$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Config:
    name: str
    server: str
    # llama-server's own options for this configuration (DRAFT_ARG: the draft's path).
    flags: tuple[str, ...] = ()
    # Tandem's `speculative` request object, as pairs; empty: the server's default.
    speculative: tuple[tuple[str, str], ...] = ()
    # Send the prompt's file as the request's `prediction`.
    prediction: bool = False


CONFIGS = (
    Config("llama-server plain", LLAMA),
    Config("llama-server ngram-mod", LLAMA, ("--spec-type", "ngram-mod",
                                             "--spec-ngram-mod-n-match", "24",
                                             "--spec-ngram-mod-n-min", "48",
                                             "--spec-ngram-mod-n-max", "64")),
    Config("llama-server ngram-map-k", LLAMA, ("--spec-type", "ngram-map-k")),
    Config("llama-server draft-simple", LLAMA, ("-md", DRAFT_ARG, "--spec-type", "draft-simple")),
    Config("tandem plain", TANDEM, speculative=(("drafter", "plain"),)),
    Config("tandem default", TANDEM),
    Config("tandem lookup", TANDEM, speculative=(("drafter", "lookup"),)),
    Config("tandem prediction", TANDEM, prediction=True),
)
BY_NAME = {c.name: c for c in CONFIGS}
# Each server's own plain decoding, what its speedups are over.
PLAIN = {LLAMA: "llama-server plain", TANDEM: "tandem plain"}


@dataclass(frozen=True)
class Outcome:
    """One request's figures, or its refusal (status other than 200, `error` its message; 0:
    no answer came)."""
    config: str
    prompt: str
    repeat: int
    status: int = 200
    tps: float = 0.0
    tokens: int = 0
    prompt_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    text_sha: str = ""
    error: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def refused(self) -> bool:
        return self.status != 200


def text_sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def llama_outcome(body: dict, config: str, prompt: str, repeat: int) -> Outcome:
    """A llama-server chat completion's figures (its `timings` object)."""
    try:
        t = body["timings"]
        return Outcome(config, prompt, repeat, tps=float(t["predicted_per_second"]),
                       tokens=int(t["predicted_n"]), prompt_tokens=int(body["usage"]["prompt_tokens"]),
                       drafted=int(t.get("draft_n", 0)), accepted=int(t.get("draft_n_accepted", 0)),
                       text_sha=text_sha(body["choices"][0]["message"]["content"] or ""),
                       extra={"prompt_ms": t["prompt_ms"], "predicted_ms": t["predicted_ms"]})
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise ValueError(f"llama-server's answer lacks {e} (timings, usage, choices)") from None


def tandem_outcome(body: dict, config: str, prompt: str, repeat: int) -> Outcome:
    """A `tandem serve` chat completion's figures (its `speculative` object and usage)."""
    try:
        s, usage = body["speculative"], body["usage"]
        extra = {"mode": s["mode"], "drafter": s["drafter"], "policy": s["controller"]["policy"],
                 "decode_ms": s["decode_ms"], "prefill_ms": s["prefill_ms"],
                 "by_source": s["by_source"]}
        details = usage.get("completion_tokens_details") or {}
        for k in ("accepted_prediction_tokens", "rejected_prediction_tokens"):
            if k in details:
                extra[k] = details[k]
        return Outcome(config, prompt, repeat, tps=float(s["tokens_per_s"]),
                       tokens=int(usage["completion_tokens"]),
                       prompt_tokens=int(usage["prompt_tokens"]), drafted=int(s["drafted_tokens"]),
                       accepted=int(s["accepted_tokens"]),
                       text_sha=text_sha(body["choices"][0]["message"]["content"] or ""),
                       extra=extra)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise ValueError(f"tandem serve's answer lacks {e} (speculative, usage, choices)") from None


PARSERS = {LLAMA: llama_outcome, TANDEM: tandem_outcome}


def refusal(status: int, text: str, config: str, prompt: str, repeat: int) -> Outcome:
    """A request the server refused: its status and the one line it gave."""
    try:
        body = json.loads(text)
        err = body.get("error", body) if isinstance(body, dict) else body
        message = str(err.get("message", err) if isinstance(err, dict) else err)
    except ValueError:
        message = text
    return Outcome(config, prompt, repeat, status=status, error=message.strip()[:300])


def prediction_of(prompt: SuitePrompt) -> str:
    """The file a whole-file edit sends back: the prompt's first fenced block, fences included."""
    m = FENCED.search(prompt.prompt)
    if m is None:
        raise SystemExit(f"error: prompt {prompt.id} has no fenced file to send as the prediction")
    return m.group(0)


def request_body(prompt: SuitePrompt, config: Config, max_tokens: int) -> dict:
    body: dict = {"messages": [{"role": "user", "content": prompt.prompt}],
                  "max_tokens": max_tokens, "temperature": 0.0, "stream": False}
    if config.speculative:
        body["speculative"] = dict(config.speculative)
    if config.prediction:
        body["prediction"] = {"type": "content", "content": prediction_of(prompt)}
    return body


def ask(url: str, prompt: SuitePrompt, config: Config, max_tokens: int, repeat: int,
        timeout: float = 900) -> Outcome:
    """One non-streamed chat request, its answer parsed by its server's parser; a server that
    gives no answer (it died, or the connection broke) is recorded with status 0."""
    try:
        r = httpx.post(f"{url}/v1/chat/completions",
                       json=request_body(prompt, config, max_tokens), timeout=timeout)
    except httpx.HTTPError as e:
        return Outcome(config.name, prompt.id, repeat, status=0, error=f"no answer: {e}")
    if r.status_code != 200:
        return refusal(r.status_code, r.text, config.name, prompt.id, repeat)
    return PARSERS[config.server](r.json(), config.name, prompt.id, repeat)


def schedule(prompt_ids: Sequence[str], configs: Sequence[Config],
             repeats: int) -> list[tuple[str, int, Config]]:
    """Interleaved: each prompt through every configuration in turn, each repeat of the prompt
    in the reverse order of the one before."""
    out = []
    for p in prompt_ids:
        for r in range(repeats):
            order = list(configs) if r % 2 == 0 else list(configs)[::-1]
            out += [(p, r, c) for c in order]
    return out


class Server:
    """One server process: started, ready once its /health answers 200, stopped."""

    def __init__(self, argv: list[str], port: int, log: Path, env: dict | None = None,
                 ready_s: float = 600) -> None:
        self.argv, self.url, self.log, self.env = argv, f"http://127.0.0.1:{port}", log, env
        self.ready_s = ready_s
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Server":
        with open(self.log, "ab") as f:
            self.proc = subprocess.Popen(self.argv, stdout=f, stderr=subprocess.STDOUT,
                                         env=self.env)
        deadline = time.monotonic() + self.ready_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-1500:]
                raise SystemExit(f"error: {shlex.join(self.argv[:3])} exited "
                                 f"({self.proc.returncode}):\n{tail}")
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise SystemExit(f"error: {self.argv[0]} was not ready within {self.ready_s:.0f} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def llama_argv(binary: str, config: Config, port: int, args: argparse.Namespace) -> list[str]:
    flags = [str(DRAFT.path) if f == DRAFT_ARG else f for f in config.flags]
    return [binary, "-m", str(TARGET.path), "--host", "127.0.0.1", "--port", str(port),
            "-t", str(args.threads), "-c", str(args.ctx), "-np", "1", "--no-webui",
            *flags, *shlex.split(args.llama_args)]


def tandem_argv(port: int, args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--threads",
            str(args.threads), "--ctx", str(args.ctx), "--parallel", "1", "--no-history"]


def starter(args: argparse.Namespace, logs: Path) -> Callable[[Config], Server]:
    """The server for a configuration: a llama-server with its flags, or `tandem serve`."""
    def start(config: Config) -> Server:
        port = free_port()
        if config.server == LLAMA:
            return Server(llama_argv(args.llama_server, config, port, args), port,
                          logs / "llama-server.log")
        # Open on 127.0.0.1: a key in the environment would make every request a 401.
        env = {k: v for k, v in os.environ.items() if k != "TANDEM_API_KEY"}
        return Server(tandem_argv(port, args), port, logs / "tandem-serve.log", env)
    return start


def run(plan: Sequence[tuple[str, int, Config]], prompts: dict[str, SuitePrompt],
        start: Callable[[Config], Server], max_tokens: int,
        progress: Callable[[Outcome], None] = lambda o: None) -> Iterator[Outcome]:
    """Every request of `plan`, one server up at a time: a llama-server per request, one
    `tandem serve` for the Tandem requests that come together."""
    warmed = [c for c in dict.fromkeys(c for _, _, c in plan) if c.server == TANDEM]
    current: tuple[object, Server] | None = None
    try:
        for i, (pid, rep, config) in enumerate(plan):
            key: object = TANDEM if config.server == TANDEM else i
            if current is None or current[0] != key:
                if current is not None:
                    current[1].stop()
                current = (key, start(config).start())
                for c in warmed if config.server == TANDEM else [config]:
                    ask(current[1].url, WARMUP, c, WARMUP_TOKENS, -1)
            outcome = ask(current[1].url, prompts[pid], config, max_tokens, rep)
            progress(outcome)
            yield outcome
    finally:
        if current is not None:
            current[1].stop()


def p10(xs: Sequence[float]) -> float:
    return float(np.percentile(xs, 10))


def rates(outcomes: Sequence[Outcome]) -> dict[str, dict[str, float]]:
    """Per configuration, per prompt: the median decode rate over its answered repeats."""
    by: dict[str, dict[str, list[float]]] = {}
    for o in outcomes:
        if not o.refused:
            by.setdefault(o.config, {}).setdefault(o.prompt, []).append(o.tps)
    return {c: {p: statistics.median(v) for p, v in ps.items()} for c, ps in by.items()}


def speedups(outcomes: Sequence[Outcome]) -> dict[str, dict[str, float]]:
    """Per configuration, per prompt: its median rate over its own server's plain one."""
    r = rates(outcomes)
    out: dict[str, dict[str, float]] = {}
    for name, per in r.items():
        plain = r.get(PLAIN[BY_NAME[name].server], {})
        out[name] = {p: v / plain[p] for p, v in per.items() if plain.get(p)}
    return out


@dataclass(frozen=True)
class Row:
    config: str
    answered: int
    refused: int
    tps_median: float | None
    tps_min: float | None
    tps_max: float | None
    speedup_median: float | None
    speedup_p10: float | None
    acceptance: float | None
    drafted_per_answer: float | None
    same_text_as_plain: str
    error: str = ""


def summary(outcomes: Sequence[Outcome], configs: Sequence[Config]) -> list[Row]:
    r, s = rates(outcomes), speedups(outcomes)
    plain_text = {(o.config, o.prompt, o.repeat): o.text_sha for o in outcomes if not o.refused}
    rows = []
    for c in configs:
        mine = [o for o in outcomes if o.config == c.name]
        ok = [o for o in mine if not o.refused]
        tps = list(r.get(c.name, {}).values())
        sp = list(s.get(c.name, {}).values())
        drafted = sum(o.drafted for o in ok)
        same = [plain_text.get((PLAIN[c.server], o.prompt, o.repeat)) == o.text_sha for o in ok
                if (PLAIN[c.server], o.prompt, o.repeat) in plain_text]
        rows.append(Row(c.name, len(ok), len(mine) - len(ok),
                        statistics.median(tps) if tps else None, min(tps, default=None),
                        max(tps, default=None), statistics.median(sp) if sp else None,
                        p10(sp) if sp else None,
                        sum(o.accepted for o in ok) / drafted if drafted else None,
                        drafted / len(ok) if ok else None, f"{sum(same)}/{len(same)}",
                        next((f"{o.status}: {o.error}" for o in mine if o.refused), "")))
    return rows


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(rows: Sequence[Row]) -> list[str]:
    out = ["| configuration | answers | decode tok/s median (min-max over prompts) | speedup over "
           "own plain, median | p10 | acceptance | drafted / answer | same text as own plain |",
           "|---|---:|---|---:|---:|---:|---:|---:|"]
    for x in rows:
        if not x.answered:
            # The refusal's first clause (a server may list what it takes after it).
            out.append(f"| {x.config} | refused {x.refused} | {x.error.split('; ')[0][:100]} "
                       "| - | - | - | - | - |")
            continue
        out.append(f"| {x.config} | {x.answered} | {fmt(x.tps_median, '.1f')} "
                   f"({fmt(x.tps_min, '.1f')}-{fmt(x.tps_max, '.1f')}) | "
                   f"{fmt(x.speedup_median, '.2f')}x | {fmt(x.speedup_p10, '.2f')}x | "
                   f"{fmt(x.acceptance, '.2f')} | {fmt(x.drafted_per_answer, '.0f')} | "
                   f"{x.same_text_as_plain} |")
    return out


def per_prompt(outcomes: Sequence[Outcome], configs: Sequence[Config]) -> list[str]:
    s = speedups(outcomes)
    prompts = list(dict.fromkeys(o.prompt for o in outcomes))
    out = ["| prompt | " + " | ".join(c.name for c in configs) + " |",
           "|---|" + "---:|" * len(configs)]
    for p in prompts:
        out.append(f"| {p} | " + " | ".join(fmt(s.get(c.name, {}).get(p), ".2f")
                                            for c in configs) + " |")
    return out


def cpu_line() -> str:
    """Model name, family and model, cores and the SIMD flags llama.cpp's kernels follow."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            info.setdefault(k.strip(), v.strip())
    except OSError:
        return "unknown CPU"
    simd = [f for f in info.get("flags", "").split()
            if f in {"avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16",
                     "avx512vbmi", "avx_vnni", "amx_tile"}]
    return (f"{info.get('model name', '?')} (family {info.get('cpu family', '?')} model "
            f"{info.get('model', '?')}), {os.cpu_count()} cores, flags {' '.join(simd)}")


def prompt_token_note(outcomes: Sequence[Outcome]) -> str:
    """Whether both servers saw the same prompt: its token count through each chat template."""
    seen: dict[str, dict[str, set[int]]] = {}
    for o in outcomes:
        if not o.refused:
            seen.setdefault(o.prompt, {}).setdefault(BY_NAME[o.config].server, set()).add(
                o.prompt_tokens)
    differ = [f"{p} ({', '.join(f'{k} {sorted(v)}' for k, v in by.items())})"
              for p, by in seen.items() if len(set().union(*by.values())) > 1]
    return ("The prompts' token counts differ: " + "; ".join(differ) + "." if differ
            else "Both servers counted the same prompt tokens on every prompt.")


def report(outcomes: Sequence[Outcome], configs: Sequence[Config], head: dict) -> str:
    tandem_default = sorted({f"{o.extra.get('drafter')}/{o.extra.get('policy')}"
                             for o in outcomes if o.config == "tandem default" and not o.refused})
    lines = [f"# llama-server beside tandem serve: {head['prompts']}", "",
             f"`{head['command']}`", "",
             f"CPU: {head['cpu']}. {head['date']}; load {head['load_before']:.2f} before, "
             f"{head['load_after']:.2f} after. Target {TARGET.filename}, draft {DRAFT.filename}; "
             f"greedy, {head['max_tokens']} tokens, {head['threads']} threads, ctx {head['ctx']}, "
             f"one slot each, {head['repeats']} repeats of {head['n_prompts']} prompts, "
             f"interleaved. llama-server {head['llama_server']}.", "",
             *table(summary(outcomes, configs)), "",
             "Speedup over its own server's plain, per prompt:", "",
             *per_prompt(outcomes, configs), "",
             "Decode only: llama-server's `timings.predicted_per_second` ((predicted_n - 1) / "
             "predicted_ms, from its first generated token to its last); Tandem's "
             "`speculative.tokens_per_s` (completion tokens / decode_ms, from the end of the "
             "prefill to the last committed token). Acceptance: accepted over drafted tokens, "
             "all answers. A llama-server is started per request (ngram-mod's pool holds only "
             "that request); `tandem serve --parallel 1 --no-history` keeps its evidence across "
             f"requests. Tandem's default ran as {', '.join(tandem_default) or '-'}. "
             + prompt_token_note(outcomes)]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--llama-server", required=True, help="the llama-server binary")
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--limit", type=int, default=None, help="the first N prompts only")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--configs", default=",".join(c.name for c in CONFIGS),
                    help="comma-separated configuration names (default: all)")
    ap.add_argument("--llama-args", default="", help="more options for every llama-server")
    ap.add_argument("--out", type=Path, default=None,
                    help="report folder: table.md and peer.json (default: print only)")
    args = ap.parse_args(argv)
    unknown = [n for n in args.configs.split(",") if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown configuration {unknown[0]!r}; known: {', '.join(BY_NAME)}")
    if args.repeats < 1 or args.max_tokens < 1 or (args.limit is not None and args.limit < 1):
        ap.error("--repeats, --max-tokens and --limit must be at least 1")
    return args


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    configs = [BY_NAME[n] for n in args.configs.split(",")]
    suite = load_suite(args.prompts)
    prompts = list(suite.prompts[:args.limit])
    for m in (TARGET, DRAFT):
        if not m.path.is_file():
            raise SystemExit(f"error: {m.path} is missing (python -m models.embedded ensure)")
    head = {"command": "python -m bench.llama_server_peer " + shlex.join(argv),
            "cpu": cpu_line(), "prompts": f"{suite.name} v{suite.version}",
            "n_prompts": len(prompts), "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
            "load_before": os.getloadavg()[0], "max_tokens": args.max_tokens,
            "threads": args.threads, "ctx": args.ctx, "repeats": args.repeats,
            "llama_server": args.llama_server}
    logs = Path(tempfile.mkdtemp(prefix="tandem-peer-"))
    print(f"# {head['cpu']}; server logs in {logs}", file=sys.stderr, flush=True)
    plan = schedule([p.id for p in prompts], configs, args.repeats)
    outcomes = list(run(plan, {p.id: p for p in prompts}, starter(args, logs), args.max_tokens,
                        progress=lambda o: print(json.dumps(asdict(o)), file=sys.stderr,
                                                 flush=True)))
    head["load_after"] = os.getloadavg()[0]
    text = report(outcomes, configs, head)
    print(text, end="")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "table.md").write_text(text)
        (args.out / "peer.json").write_text(json.dumps(
            {"context": head, "outcomes": [asdict(o) for o in outcomes]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

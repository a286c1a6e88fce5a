"""bench/llama_server_peer.py without llama-server or a model: both servers' answers parsed, the
interleaved order, the speedup arithmetic, a refused configuration, and the server processes, on
fake HTTP servers on 127.0.0.1."""
from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench import llama_server_peer as peer
from bench.benchmark.suite import SuitePrompt, load_suite
from bench.research.soak import free_port

LLAMA_BODY = {"choices": [{"message": {"role": "assistant", "content": "```python\nx = 1\n```"}}],
              "usage": {"prompt_tokens": 120, "completion_tokens": 33},
              "timings": {"prompt_n": 120, "prompt_ms": 900.0, "predicted_n": 33,
                          "predicted_ms": 1600.0, "predicted_per_second": 20.0,
                          "draft_n": 40, "draft_n_accepted": 30}}


def tandem_body(tps: float, drafted: int = 10, accepted: int = 5, details: dict | None = None) -> dict:
    usage: dict = {"prompt_tokens": 118, "completion_tokens": 32}
    if details is not None:
        usage["completion_tokens_details"] = details
    return {"choices": [{"message": {"content": "```python\nx = 1\n```"}}], "usage": usage,
            "speculative": {"mode": "speculative", "drafter": "hybrid", "tokens_per_s": tps,
                            "drafted_tokens": drafted, "accepted_tokens": accepted,
                            "decode_ms": 1500.0, "prefill_ms": 700.0,
                            "by_source": {"prompt-lookup": {"drafted": drafted, "accepted": accepted}},
                            "controller": {"policy": "adaptive"}}}


def test_llama_server_answer_parsed():
    o = peer.llama_outcome(LLAMA_BODY, "llama-server ngram-mod", "p1", 0)
    assert (o.tps, o.tokens, o.prompt_tokens, o.drafted, o.accepted) == (20.0, 33, 120, 40, 30)
    assert o.text_sha == peer.text_sha("```python\nx = 1\n```") and not o.refused
    plain = json.loads(json.dumps(LLAMA_BODY))
    del plain["timings"]["draft_n"], plain["timings"]["draft_n_accepted"]
    assert peer.llama_outcome(plain, "llama-server plain", "p1", 0).drafted == 0
    del plain["timings"]
    with pytest.raises(ValueError, match="timings"):
        peer.llama_outcome(plain, "llama-server plain", "p1", 0)


def test_tandem_answer_parsed_with_prediction_counts():
    body = tandem_body(25.5, 64, 60, {"accepted_prediction_tokens": 60,
                                      "rejected_prediction_tokens": 4})
    o = peer.tandem_outcome(body, "tandem prediction", "p1", 1)
    assert (o.tps, o.tokens, o.prompt_tokens, o.drafted, o.accepted) == (25.5, 32, 118, 64, 60)
    assert o.extra["accepted_prediction_tokens"] == 60 and o.extra["policy"] == "adaptive"
    assert "accepted_prediction_tokens" not in peer.tandem_outcome(
        tandem_body(20.0), "tandem default", "p1", 0).extra
    with pytest.raises(ValueError, match="speculative"):
        peer.tandem_outcome({"usage": {}}, "tandem default", "p1", 0)


def test_refusal_keeps_the_servers_line():
    text = json.dumps({"error": {"message": "unsupported field 'prediction'", "type": "x"}})
    o = peer.refusal(400, text, "tandem prediction", "p1", 0)
    assert o.refused and o.status == 400 and o.error == "unsupported field 'prediction'"
    assert peer.refusal(503, "busy\n", "tandem plain", "p1", 0).error == "busy"


def test_schedule_interleaves_and_alternates_repeats():
    a, b, c = peer.CONFIGS[:3]
    plan = peer.schedule(["p1", "p2"], [a, b, c], 3)
    assert [(p, r, x.name) for p, r, x in plan] == [
        ("p1", 0, a.name), ("p1", 0, b.name), ("p1", 0, c.name),
        ("p1", 1, c.name), ("p1", 1, b.name), ("p1", 1, a.name),
        ("p1", 2, a.name), ("p1", 2, b.name), ("p1", 2, c.name),
        ("p2", 0, a.name), ("p2", 0, b.name), ("p2", 0, c.name),
        ("p2", 1, c.name), ("p2", 1, b.name), ("p2", 1, a.name),
        ("p2", 2, a.name), ("p2", 2, b.name), ("p2", 2, c.name)]


def outcome(config: str, prompt: str, repeat: int, tps: float, drafted: int = 0,
            accepted: int = 0, sha: str = "t") -> peer.Outcome:
    return peer.Outcome(config, prompt, repeat, tps=tps, drafted=drafted, accepted=accepted,
                        text_sha=sha)


def test_speedups_median_p10_and_acceptance():
    lp, lm, tp = "llama-server plain", "llama-server ngram-mod", "tandem plain"
    outs = []
    for i, p in enumerate(["p1", "p2", "p3", "p4", "p5"]):
        # Plain: 9 and 11 (median 10); ngram-mod: (i + 1) x 10 in both repeats.
        outs += [outcome(lp, p, 0, 9.0), outcome(lp, p, 1, 11.0),
                 outcome(lm, p, 0, 10.0 * (i + 1), 10, 6, sha="t" if i else "other"),
                 outcome(lm, p, 1, 10.0 * (i + 1), 10, 2),
                 outcome(tp, p, 0, 20.0)]
    s = peer.speedups(outs)
    assert s[lm] == pytest.approx({"p1": 1.0, "p2": 2.0, "p3": 3.0, "p4": 4.0, "p5": 5.0})
    assert s[tp] == {p: 1.0 for p in ["p1", "p2", "p3", "p4", "p5"]}
    rows = {r.config: r for r in peer.summary(outs, [peer.BY_NAME[n] for n in (lp, lm, tp)])}
    m = rows[lm]
    assert (m.speedup_median, m.tps_min, m.tps_max, m.answered) == (3.0, 10.0, 50.0, 10)
    assert m.speedup_p10 == pytest.approx(1.4)  # linear between the two lowest: 1 + 0.4 x 1
    assert m.acceptance == pytest.approx(40 / 100) and m.drafted_per_answer == 10
    assert m.same_text_as_plain == "9/10"
    assert rows[lp].speedup_median == 1.0 and rows[lp].acceptance is None


def test_prediction_is_the_prompts_file():
    suite = load_suite(peer.DEFAULT_PROMPTS)
    assert len(suite.prompts) >= 8
    for p in suite.prompts:
        pred = peer.prediction_of(p)
        assert pred.startswith("```") and pred.endswith("```") and pred in p.prompt
        assert pred.count("\n") > 20  # a whole file, not a snippet
    body = peer.request_body(suite.prompts[0], peer.BY_NAME["tandem prediction"], 256)
    assert body["prediction"] == {"type": "content", "content": peer.prediction_of(suite.prompts[0])}
    assert body["temperature"] == 0.0 and body["max_tokens"] == 256 and "speculative" not in body
    assert peer.request_body(suite.prompts[0], peer.BY_NAME["tandem lookup"], 8)["speculative"] == {
        "drafter": "lookup"}
    with pytest.raises(SystemExit, match="no fenced file"):
        peer.prediction_of(SuitePrompt("x", "c", "no file here"))


class _Fake(ThreadingHTTPServer):
    """llama-server or tandem serve as far as the benchmark sees: /health and chat answers."""
    def __init__(self, kind: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.kind, self.requests = kind, []  # type: ignore[var-annotated]


class _Handler(BaseHTTPRequestHandler):
    server: _Fake

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, obj: object) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send(200, {"status": "ok"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(body)
        if self.server.kind == peer.LLAMA:
            return self._send(200, LLAMA_BODY)
        if "prediction" in body:
            return self._send(400, {"error": {"message": "unsupported field 'prediction'; this "
                                                         "server takes messages, model"}})
        plain = body.get("speculative", {}).get("drafter") == "plain"
        self._send(200, tandem_body(10.0 if plain else 15.0))


class _Started:
    """A Server whose process is the in-thread fake: counts its starts and stops."""
    def __init__(self, fake: _Fake, log: list) -> None:
        self.url, self.fake, self.log = f"http://127.0.0.1:{fake.server_address[1]}", fake, log

    def start(self) -> "_Started":
        self.log.append(("start", self.fake.kind))
        return self

    def stop(self) -> None:
        self.log.append(("stop", self.fake.kind))


@pytest.fixture
def fakes():
    servers = {k: _Fake(k) for k in (peer.LLAMA, peer.TANDEM)}
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers.values()]
    for t in threads:
        t.start()
    yield servers
    for s in servers.values():
        s.shutdown()
        s.server_close()


def test_run_against_fake_servers_records_the_refused_configuration(fakes):
    prompts = {p.id: p for p in load_suite(peer.DEFAULT_PROMPTS).prompts[:2]}
    configs = [peer.BY_NAME[n] for n in ("llama-server plain", "llama-server ngram-mod",
                                         "tandem plain", "tandem prediction")]
    log: list = []
    plan = peer.schedule(list(prompts), configs, 2)
    outs = list(peer.run(plan, prompts, lambda c: _Started(fakes[c.server], log), 256))
    assert [(o.config, o.prompt, o.repeat) for o in outs] == [
        (c.name, p, r) for p, r, c in plan]
    refused = [o for o in outs if o.refused]
    assert {o.config for o in refused} == {"tandem prediction"} and len(refused) == 4
    assert refused[0].error == "unsupported field 'prediction'; this server takes messages, model"
    # A llama-server per request; one tandem serve for the Tandem requests that come together;
    # never two up at once.
    up = 0
    for event, _ in log:
        up += 1 if event == "start" else -1
        assert up in (0, 1)
    assert up == 0
    assert log.count(("start", peer.LLAMA)) == 8 and log.count(("start", peer.TANDEM)) == 2
    # Each server's first request is the warm-up (Tandem's: one per Tandem configuration).
    assert [r["max_tokens"] for r in fakes[peer.TANDEM].requests[:2]] == [peer.WARMUP_TOKENS] * 2
    assert fakes[peer.LLAMA].requests[0]["max_tokens"] == peer.WARMUP_TOKENS
    measured = [r for r in fakes[peer.LLAMA].requests if r["max_tokens"] == 256]
    assert len(measured) == 8 and all(r["temperature"] == 0.0 for r in measured)
    rows = {r.config: r for r in peer.summary(outs, configs)}
    assert rows["tandem prediction"].answered == 0 and rows["tandem prediction"].refused == 4
    text = "\n".join(peer.table(list(rows.values())))
    assert "| tandem prediction | refused 4 | 400: unsupported field 'prediction' |" in text
    assert rows["tandem plain"].speedup_median == 1.0


HEALTH = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_server_process_started_ready_and_stopped(tmp_path):
    port = free_port()
    s = peer.Server([sys.executable, "-c", HEALTH, str(port)], port, tmp_path / "log", ready_s=60)
    s.start()
    proc = s.proc
    assert proc is not None and proc.poll() is None
    s.stop()
    assert proc.poll() is not None and s.proc is None


def test_server_that_exits_is_one_error_with_its_log(tmp_path):
    bad = peer.Server([sys.executable, "-c", "print('no such model'); raise SystemExit(3)"],
                      free_port(), tmp_path / "log", ready_s=60)
    with pytest.raises(SystemExit, match="(?s)exited \\(3\\).*no such model"):
        bad.start()


def test_argv_of_both_servers():
    args = peer.parse_args(["--llama-server", "/x/llama-server", "--llama-args", "-fa off"])
    argv = peer.llama_argv(args.llama_server, peer.BY_NAME["llama-server draft-simple"], 8081, args)
    assert argv[:3] == ["/x/llama-server", "-m", str(peer.TARGET.path)]
    assert ["-t", "2"] == argv[argv.index("-t"):argv.index("-t") + 2]
    assert ["-md", str(peer.DRAFT.path)] == argv[argv.index("-md"):argv.index("-md") + 2]
    assert argv[-2:] == ["-fa", "off"] and ["-np", "1"] == argv[argv.index("-np"):][:2]
    t = peer.tandem_argv(8082, args)
    assert t[1:4] == ["-m", "app.cli", "serve"] and "--no-history" in t
    assert ["--parallel", "1"] == t[t.index("--parallel"):][:2]
    with pytest.raises(SystemExit):
        peer.parse_args(["--llama-server", "x", "--configs", "llama-server turbo"])


def test_prompt_token_counts_compared_across_servers():
    a = peer.Outcome("llama-server plain", "p1", 0, prompt_tokens=120)
    b = peer.Outcome("tandem plain", "p1", 0, prompt_tokens=120)
    c = peer.Outcome("tandem lookup", "p2", 0, prompt_tokens=90)
    d = peer.Outcome("llama-server plain", "p2", 0, prompt_tokens=91)
    assert peer.prompt_token_note([a, b]).startswith("Both servers counted the same")
    note = peer.prompt_token_note([a, b, c, d])
    assert "p2 (tandem [90], llama-server [91])" in note and "p1" not in note


def test_a_server_that_gives_no_answer_is_recorded_not_fatal():
    o = peer.ask(f"http://127.0.0.1:{free_port()}", peer.WARMUP, peer.BY_NAME["tandem plain"], 8, 0,
                 timeout=10)
    assert o.refused and o.status == 0 and o.error.startswith("no answer")

"""bench/first_request.py's logic over fake servers (no model, nothing timed): a priming process
first, then a fresh process per rotation of the prompts, each stopped after its requests; where
each process's calibration came from; request 1 set against the same prompt's later requests and
their spread; the report and the command line's refusals."""
from __future__ import annotations

import os

import pytest

from bench import first_request as fr
from bench.llama_server_peer import Outcome


class FakeServer:
    def __init__(self, n: int, events: list) -> None:
        self.url = f"http://fake/{n}"
        self.events = events

    def stop(self) -> None:
        self.events.append(("stop", self.url))


def outcome(prompt: str, tps: float, process: int = 0) -> Outcome:
    return Outcome("tandem default", prompt, process, tps=tps, tokens=32)


def test_rotations_open_each_process_with_another_prompt_and_need_enough_prompts():
    orders = fr.rotations(["a", "b", "c", "d"], 3, 3)
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    # Each prompt opens one process and comes later in each of the others.
    for first, order in zip("abc", orders):
        assert order[0] == first and all(first in o[1:] for o in orders if o is not order)
    with pytest.raises(ValueError, match="4 requests a process need as many prompts, got 3"):
        fr.rotations(["a", "b", "c"], 2, 4)


def test_a_primed_machine_then_a_fresh_process_per_order_each_stopped_and_its_calibration_said(tmp_path):
    calibrations = tmp_path / "calibrations"
    calibrations.mkdir()
    events: list = []
    started = [0]
    # What each process does to the store and its log: the priming one measures and keeps, the
    # first measured one finds it, the second is busy (its log says so), the third measures anew.
    logs = {2: "", 3: f"note: the machine was busy; {fr.NOT_KEPT}, and the next", 4: ""}

    def start():
        started[0] += 1
        n = started[0]
        events.append(("start", n))
        if n in (1, 4):
            (calibrations / "pair.json").write_text(str(n))
            # A new modification time whatever the filesystem's resolution.
            os.utime(calibrations / "pair.json", ns=(n * 10**9, n * 10**9))
        return FakeServer(n, events), lambda: logs.get(n, "")

    def asker(url, prompt, config, max_tokens, repeat):
        events.append(("ask", url, prompt.id, max_tokens))
        return outcome(prompt.id, 10.0 + len(events), repeat)

    ticks = iter(range(1000))
    prompts = {p: fr.SuitePrompt(p, "file-editing", f"edit {p}") for p in "abc"}
    processes = list(fr.run(fr.rotations(list(prompts), 3, 2), prompts, start, 64,
                            calibrations, asker=asker, clock=lambda: float(next(ticks))))
    asks = [e for e in events if e[0] == "ask"]
    assert asks[0] == ("ask", "http://fake/1", "prime", fr.PRIME_TOKENS)
    assert [(a[1], a[2]) for a in asks[1:]] == [("http://fake/2", "a"), ("http://fake/2", "b"),
                                                ("http://fake/3", "b"), ("http://fake/3", "a"),
                                                ("http://fake/4", "a"), ("http://fake/4", "b")]
    assert all(a[3] == 64 for a in asks[1:])
    # Each process is stopped before the next starts.
    order = [e for e in events if e[0] in ("start", "stop")]
    assert order == [("start", 1), ("stop", "http://fake/1"), ("start", 2), ("stop", "http://fake/2"),
                     ("start", 3), ("stop", "http://fake/3"), ("start", 4), ("stop", "http://fake/4")]
    assert [p.calibration for p in processes] == [fr.KEPT_BEFORE, fr.MEASURED_BUSY,
                                                  fr.MEASURED_KEPT]
    assert [[r.position for r in p.requests] for p in processes] == [[1, 2]] * 3
    assert all(r.wall_s == 1.0 for p in processes for r in p.requests)


def process(index: int, rates: list[tuple[str, float]], calibration: str = fr.KEPT_BEFORE):
    return fr.Process(index, calibration, tuple(
        fr.Request(index, i + 1, outcome(p, tps, index), 2.0 + i) for i, (p, tps) in enumerate(rates)))


def test_request_one_is_set_against_the_same_prompts_later_requests_and_their_spread():
    processes = [process(0, [("a", 9.0), ("b", 20.0), ("c", 30.0)]),
                 process(1, [("b", 18.0), ("c", 33.0), ("a", 10.0)]),
                 process(2, [("c", 27.0), ("a", 11.0), ("b", 22.0)])]
    s = fr.summarise(processes)
    # a: 9 against its later 10 and 11 (median 10.5); b: 18 against 20, 22; c: 27 against 30, 33.
    assert s.first_over_later == [(0, "a", round(9 / 10.5, 4)), (1, "b", round(18 / 21, 4)),
                                  (2, "c", round(27 / 31.5, 4))]
    assert s.median == round(18 / 21, 4)
    assert s.spread == (round(10 / 10.5, 4), round(33 / 31.5, 4))
    assert s.first_tps == [9.0, 18.0, 27.0] and len(s.later_tps) == 6
    assert "slower than that" in fr.verdict(s)

    steady = [process(0, [("a", 10.5), ("b", 20.0)]), process(1, [("b", 21.0), ("a", 10.0)]),
              process(2, [("a", 10.4), ("b", 22.0)])]
    s = fr.summarise(steady)
    # a opened two processes (10.5, 10.4) against its one later 10.0; b one (21) against 20, 22.
    assert s.first_over_later == [(0, "a", 1.05), (1, "b", 1.0), (2, "a", 1.04)]
    # a is later only once: no spread of its own; b twice: 20/21 to 22/21.
    assert s.spread == (round(20 / 21, 4), round(22 / 21, 4)) and s.median == 1.04
    assert "within it" in fr.verdict(s)


def test_a_refused_request_is_left_out_and_nothing_to_compare_is_said():
    refused = fr.Request(0, 1, Outcome("tandem default", "a", 0, status=500, error="boom"), 1.0)
    s = fr.summarise([fr.Process(0, fr.KEPT_BEFORE, (refused,))])
    assert s.median is None and s.first_tps == []
    assert fr.verdict(s).startswith("no prompt was answered both first and later")


def test_the_report_names_the_setup_every_request_and_a_busy_calibration():
    head = {"command": "python -m bench.first_request", "cpu": "a CPU", "prompts": "file-edits v1",
            "date": "2026-12-07 02:00 UTC", "load_before": 3.5, "load_after": 4.0,
            "max_tokens": 64, "threads": 2, "ctx": 4096, "parallel": None, "requests": 2}
    text = fr.report([process(0, [("a", 10.0), ("b", 20.0)]),
                      process(1, [("b", 19.0), ("a", 11.0)], fr.MEASURED_BUSY)], head)
    assert "load 3.50 before, 4.00 after" in text and "a CPU" in text
    assert ("| 1 | kept before | a: 10.00 tok/s, 0 drafted, 2.0 s | b: 20.00 tok/s, 0 drafted, "
            "3.0 s |") in text
    assert ("Request 1 over the same prompt's later requests: a 0.91x (process 1), b 0.95x "
            "(process 2).") in text
    assert "Process(es) 2 calibrated on a busy machine" in text


@pytest.mark.parametrize("argv,message", [(["--requests", "1"], "--requests at least 2"),
                                          (["--processes", "0"], "--processes must be"),
                                          (["--parallel", "0"], "--parallel must be")])
def test_bad_options_get_one_line(argv, message, capsys):
    with pytest.raises(SystemExit):
        fr.parse_args(argv)
    assert message in capsys.readouterr().err


def test_serve_runs_without_history_on_the_settings_given():
    args = fr.parse_args(["--threads", "2", "--parallel", "1"])
    argv = fr.serve_argv(8080, args)
    assert argv[1:4] == ["-m", "app.cli", "serve"] and "--no-history" in argv
    assert argv[argv.index("--parallel") + 1] == "1"
    assert "--parallel" not in fr.serve_argv(8080, fr.parse_args([]))

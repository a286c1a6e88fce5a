"""bench/research/control_pairs.py: a bench's runs regrouped into repetitions, each one run of every
configuration, so the default and the control are compared within one repetition."""
from __future__ import annotations

import json

from bench.research import control_pairs


D, C = control_pairs.DEFAULT, control_pairs.CONTROL


def run(order: int, prompt: str, config: str, tps: float, drafted: int = 0) -> dict:
    return {"order": order, "prompt_id": prompt, "temperature": 0.0, "top_p": 1.0,
            "config": config, "tokens_per_s": tps, "drafted_tokens": drafted}


def test_runs_regroup_into_repetitions_in_run_order():
    # Two prompts, two repetitions each; the order inside a repetition alternates.
    runs = [run(0, "a", "baseline", 30), run(1, "a", D, 30, 2), run(2, "a", C, 31),
            run(3, "a", D, 29), run(4, "a", C, 30), run(5, "a", "baseline", 30),
            run(6, "b", "baseline", 20), run(7, "b", D, 22, 4), run(8, "b", C, 20),
            run(9, "b", D, 20), run(10, "b", C, 21), run(11, "b", "baseline", 20)]
    reps = control_pairs.repetitions(list(reversed(runs)))
    assert [sorted(r) for r in reps] == [sorted(["baseline", D, C])] * 4
    assert [r[D]["order"] for r in reps] == [1, 3, 7, 9]


def test_the_split_reads_whether_the_default_drafted(tmp_path, capsys):
    runs = [run(0, "a", "baseline", 30), run(1, "a", D, 33, 2), run(2, "a", C, 30),
            run(3, "a", D, 27), run(4, "a", C, 30), run(5, "a", "baseline", 30)]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": runs}))
    assert control_pairs.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "drafted nothing: 1 repetitions, default / control mean 0.900" in out
    assert "drafted: 1 repetitions, default / control mean 1.100" in out

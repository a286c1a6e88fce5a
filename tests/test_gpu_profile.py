"""The measured GPU profile (bench/benchmark/gpu_profile.py): read from the H200 run's result
file, the curve that file's run measured, labelled with its device, target and date, extended
past its widest width as the label says; and every GPU figure follows the file's curve."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.benchmark import gpu_profile
from bench.benchmark.gpu_profile import PROFILE, load, measured, parse
from bench.benchmark.theory import call_widths, gpu_profile_speedup
from bench.research import policy_sim

CALIBRATE = PROFILE.parent / "h200-calibrate.json"


def copy_with(tmp_path: Path, **changes) -> Path:
    data = json.loads(PROFILE.read_text()) | changes
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return path


def test_the_profile_is_the_h200_runs_measured_curve_and_says_whose():
    p = measured()
    ceiling = json.loads(CALIBRATE.read_text())["ceiling"]
    # The run's own numbers, not a curve typed in by hand.
    assert list(p.verify_ms) == ceiling["verify_ms"] and list(p.draft_ms) == ceiling["draft_ms"]
    assert p.widths == tuple(range(1, len(ceiling["verify_ms"]) + 1))
    assert p.draft_cost == pytest.approx(ceiling["draft_relative"], abs=1e-3)
    assert p.label == "H200 measured, Qwen2.5-7B-shaped Q4_K_M target, 2026-12-04"
    assert "NVIDIA H200" in p.device and "28 blocks, 3584 wide" in p.target
    assert "measured at widths 1-9, past 9 linear at +0.56 ms a row" in p.description


def test_between_measured_widths_it_interpolates_and_past_them_extends_at_the_mean_slope(tmp_path):
    p = load(copy_with(tmp_path, widths=[1, 2, 4, 8], verify_ms=[10.0, 12.0, 13.0, 17.0],
                       draft_ms=[2.0, 2.0, 3.0, 4.0]))
    assert p.verify(3) == pytest.approx(12.5)
    assert p.verify(6) == pytest.approx(15.0)
    # (17 - 10) / 7 = 1 ms a row past width 8.
    assert p.verify(16) == pytest.approx(25.0)
    assert p.draft_decode(15) == pytest.approx(4.0 + 2.0 / 7 * 7)
    assert p.ratio(8) == pytest.approx(1.7) and p.draft_cost == pytest.approx(0.2)
    assert "measured at widths 1-2, 4, 8, past 8 linear at +1.00 ms a row" in p.extension


def test_a_replays_gpu_figures_follow_the_files_curve(tmp_path):
    gen = list(range(10, 40))
    rec = {"id": "t", "cat": "x", "toks": [1, 2, 3, 4], "gen": gen, "dargmax": gen + [0],
           "dconf": [0.99] * 31, "tconf": [0.99] * 31}

    def speed(p):
        return policy_sim.replay_one(rec, lambda: None, policy_sim.gpu_costs(p), 0.5, "hybrid")

    h200 = measured()
    # The same run with verifies that cost what one token does: drafting gains more.
    flatter = load(copy_with(tmp_path, verify_ms=[h200.verify_ms[0]] * len(h200.widths)))
    assert speed(flatter) > speed(h200) * 1.05
    drafted_at = [10, 10, 10, 6]
    assert (gpu_profile_speedup(40, 12, drafted_at, 36, flatter)
            > gpu_profile_speedup(40, 12, drafted_at, 36, h200))


def test_the_prediction_reads_each_calls_width_from_the_drafted_positions(tmp_path):
    # 12 calls: 4 drafted 4 (width 5), 6 drafted 3 (width 4), 2 plain.
    assert call_widths(12, [10, 10, 10, 4]) == {5: 4, 4: 6, 1: 2}
    assert call_widths(3, []) == {1: 3}
    with pytest.raises(ValueError, match="cannot hold"):
        call_widths(2, [3])
    p = load(copy_with(tmp_path, widths=[1, 5], verify_ms=[10.0, 20.0], draft_ms=[5.0, 9.0]))
    # Costs in target tokens: 4 x 2 + 6 x 1.75 + 2 x 1, and 0.5 a drafted token.
    assert gpu_profile_speedup(40, 12, [10, 10, 10, 4], 36, p) == pytest.approx(
        40 / (8 + 10.5 + 2 + 0.5 * 36))


def test_a_bad_profile_file_is_a_one_line_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no measured GPU profile at"):
        load(tmp_path / "missing.json")
    data = json.loads(PROFILE.read_text())
    del data["date"]
    with pytest.raises(ValueError, match="lacks date"):
        parse(data, "x.json")
    with pytest.raises(ValueError, match="widths must rise from 1"):
        load(copy_with(tmp_path, widths=[2, 4], verify_ms=[1.0, 2.0], draft_ms=[1.0, 1.0]))
    with pytest.raises(ValueError, match="one verify and one draft time per width"):
        load(copy_with(tmp_path, widths=[1, 2], verify_ms=[1.0], draft_ms=[1.0, 1.0]))


def test_no_gpu_curve_is_typed_in_anywhere_but_the_profiles_file():
    root = Path(gpu_profile.__file__).resolve().parents[2]
    # The old assumed profile's names and its flat ratios, outside the tests' flat fake.
    gone = ("GPU_DRAFT_COST", "GPU_RATIOS", "1.01, 1.02, 1.03")
    hits = [f"{p.relative_to(root)}: {name}" for folder in ("bench", "app", "engine", "scripts")
            for p in (root / folder).rglob("*.py") for name in gone if name in p.read_text()]
    assert hits == []


def test_a_bench_report_names_the_profile_and_an_install_without_one_leaves_the_column_empty(
        monkeypatch, tmp_path):
    from app.reports import bench_markdown
    from bench.benchmark.aggregate import summarize
    from tests.test_bench_aggregate import rec, spec
    base = rec(order=0)
    records = [base, spec(1, base, 1.5, drafted_by={"draft-model": 20}, drafted_at=[10, 10])]
    md = bench_markdown.render(summarize(records), {})
    assert f"measured GPU profile: {measured().description}" in md
    row = next(r for r in summarize(records).speedups if r.category == "overall")
    assert row.gpu_profile == pytest.approx(gpu_profile_speedup(40, 10, [10, 10], 20))
    monkeypatch.setattr(gpu_profile, "PROFILE", tmp_path / "none.json")
    row = next(r for r in summarize(records).speedups if r.category == "overall")
    assert row.gpu_profile != row.gpu_profile  # NaN
    assert "GPU profile: none in this install" in bench_markdown.render(summarize(records), {})

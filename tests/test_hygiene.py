"""The repository keeps its size: benchmark output is tracked under docs/results/latest only,
as reports, small tables and their plots, 2 MiB in all; raw runs live in the user's cache
(bench/benchmark/files.py), and no tracked file is large."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS_LIMIT = 2 << 20
# The largest tracked files are screenshots and plots of about 150 KiB.
FILE_LIMIT = 384 << 10
RAW_NAMES = ("runs.json", "runs.csv", "trace.json")


def tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]


def test_benchmark_output_is_small_and_under_latest():
    results = [p for p in tracked() if p.is_relative_to(ROOT / "docs" / "results")]
    assert results, "docs/results holds the current benchmark reports"
    outside = [str(p.relative_to(ROOT)) for p in results
               if not p.is_relative_to(ROOT / "docs" / "results" / "latest")]
    assert outside == []
    raw = [str(p.relative_to(ROOT)) for p in results
           if p.name.removesuffix(".gz") in RAW_NAMES or p.suffix == ".gz"]
    assert raw == [], "raw runs belong in the user's cache (bench/benchmark/files.py)"
    total = sum(p.stat().st_size for p in results)
    assert total <= RESULTS_LIMIT, f"docs/results holds {total / 2**20:.2f} MiB"


def test_no_tracked_file_is_large():
    big = [f"{p.relative_to(ROOT)} ({p.stat().st_size >> 10} KiB)" for p in tracked()
           if p.stat().st_size > FILE_LIMIT]
    assert big == []

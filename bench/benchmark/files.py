"""Raw benchmark data on disk: every run as JSON (with the summary and the run context) and as
one CSV row per run (list-valued fields joined with spaces).

Raw runs live in the user's cache, never beside the report: a report folder (the repository's
docs/results/latest/ among them) keeps the Markdown tables and the plots, and
`runs_dir(report folder)` names where its runs are, under $TANDEM_HOME/runs (default
~/.cache/tandem/runs).
"""
from __future__ import annotations

import csv
import json
from dataclasses import astuple, fields
from pathlib import Path
from typing import Sequence

from bench.benchmark.aggregate import Summary
from bench.benchmark.records import RunRecord
from models.tandem_store import tandem_home


def runs_dir(report: Path) -> Path:
    """Where the raw runs of the report folder `report` live (created), named after its full
    path, so a report and its runs are found from each other."""
    name = "-".join(Path(report).resolve().parts[1:]) or "root"
    path = tandem_home() / "runs" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def runs_file(report_or_file: str | Path) -> Path:
    """A bench's runs.json: the file itself, or the runs of a report folder (`runs_dir`)."""
    path = Path(report_or_file)
    return runs_dir(path) / "runs.json" if path.is_dir() else path


def write_json(path: Path, records: Sequence[RunRecord], summary: Summary, context: dict) -> Path:
    payload = {"context": context, "runs": [r.as_dict() for r in records],
               "summary": summary.as_dict()}
    path.write_text(json.dumps(payload, indent=1), encoding="utf-8")
    return path


def write_csv(path: Path, records: Sequence[RunRecord]) -> Path:
    names = [f.name for f in fields(RunRecord)]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(names)
        for r in records:
            row = []
            # A record's fields are numbers, text, lists of numbers and counts by name.
            for v in astuple(r):
                if isinstance(v, list):
                    v = " ".join(f"{x:.4g}" if isinstance(x, float) else str(x) for x in v)
                elif isinstance(v, dict):
                    v = " ".join(f"{k}={x}" for k, x in v.items())
                elif isinstance(v, float):
                    v = f"{v:.6g}"
                row.append("" if v is None else v)
            w.writerow(row)
    return path

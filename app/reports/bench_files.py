"""Raw benchmark data on disk: every run as JSON (with the summary and the run context) and as
one CSV row per run (list-valued fields joined with spaces)."""
from __future__ import annotations

import csv
import json
from dataclasses import astuple, fields
from pathlib import Path
from typing import Sequence

from engine.tools.benchmark.aggregate import Summary
from engine.tools.benchmark.records import RunRecord


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

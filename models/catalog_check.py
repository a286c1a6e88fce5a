"""The catalog against the hub: does each file exist there, and is its size the one recorded.

`scripts/verify-catalog` runs this by hand where the hub is reachable; the tests run it against
a local stand-in (tests/hubserver.py), never the real hub. Each file gets one finding: its size
is the recorded one; the catalog holds only an estimate, within TOLERANCE of the hub's size or
not; the recorded size differs; the file or its repository is missing. `write_sizes` records
the hub's sizes in catalog.json, after which a pull refuses any other size.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from engine.errors import HubError
from models import hub
from models.catalog import CATALOG_FILE, MIB
from models.atomic import write_atomically
from models.tandem_store import store_errors

# How far an estimate (size_mb) may be from the hub's size before it is reported.
TOLERANCE = 0.05
OK, ESTIMATE, DIFFERS, MISSING = "ok", "estimate", "differs", "missing"
UNREACHABLE_HINT = ("scripts/verify-catalog asks the hub for each file's size: run it where the hub"
                    " is reachable, or point HF_ENDPOINT at a mirror")


@dataclass(frozen=True)
class Finding:
    model: str
    repo: str
    filename: str
    status: str
    recorded: int | None
    estimate: int
    hub_size: int | None = None
    detail: str = ""

    @property
    def off_by(self) -> float:
        """The estimate's distance from the hub's size, as a fraction of it."""
        return abs(self.estimate - self.hub_size) / self.hub_size if self.hub_size else 0.0

    @property
    def ok(self) -> bool:
        return self.status == OK or (self.status == ESTIMATE and self.off_by <= TOLERANCE)

    def line(self) -> str:
        where = f"{self.repo}/{self.filename}"
        if self.status == OK:
            return f"ok        {where}: {self.hub_size} bytes, as recorded"
        if self.status == ESTIMATE:
            mark = "ok" if self.ok else "estimate"
            return (f"{mark:9} {where}: {self.hub_size} bytes on the hub, estimate"
                    f" {self.estimate / MIB:.0f} MiB ({100 * self.off_by:.1f}% off); not recorded")
        if self.status == DIFFERS:
            return f"DIFFERS   {where}: {self.hub_size} bytes on the hub, the catalog records {self.recorded}"
        return f"MISSING   {where}: {self.detail}"


def check(path: Path = CATALOG_FILE, endpoint_url: str | None = None) -> list[Finding]:
    """One finding per catalog file; HubError when the hub cannot be reached at all."""
    ep = hub.endpoint(endpoint_url)
    hub.probe(ep, "verifying the catalog", hint=UNREACHABLE_HINT)
    findings = []
    for mid, model in json.loads(path.read_text())["models"].items():
        repo, files = model["repo"], list(model["files"].values())
        try:
            found = hub.remote_files(repo, [f["file"] for f in files], endpoint_url=ep)
        except HubError as exc:
            found, reason = {}, str(exc)
        else:
            reason = "the repository does not hold this file"
        for f in files:
            recorded = f.get("size")
            estimate = int(recorded or f["size_mb"] * MIB)
            remote = found.get(f["file"])
            if remote is None:
                findings.append(Finding(mid, repo, f["file"], MISSING, recorded, estimate, None, reason))
            elif recorded is None:
                findings.append(Finding(mid, repo, f["file"], ESTIMATE, None, estimate, remote.size))
            else:
                status = OK if remote.size == recorded else DIFFERS
                findings.append(Finding(mid, repo, f["file"], status, recorded, estimate, remote.size))
    return findings


def write_sizes(findings: Sequence[Finding], path: Path = CATALOG_FILE) -> int:
    """Record the hub's size of every file found there; returns how many entries changed."""
    data = json.loads(path.read_text())
    changed = 0
    for f in findings:
        if f.hub_size is None:
            continue
        for entry in data["models"][f.model]["files"].values():
            if entry["file"] == f.filename and entry.get("size") != f.hub_size:
                entry["size"] = f.hub_size
                entry["size_mb"] = round(f.hub_size / MIB)
                changed += 1
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    with store_errors(path):
        write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/verify-catalog",
                                description="Compare the catalog's files and sizes with the hub.")
    p.add_argument("--catalog", type=Path, default=CATALOG_FILE)
    p.add_argument("--endpoint", default=None, help="hub URL (default: HF_ENDPOINT, else huggingface.co)")
    p.add_argument("--write", action="store_true",
                   help="record the hub's size of every file found in the catalog")
    args = p.parse_args(argv)
    try:
        findings = check(args.catalog, args.endpoint)
    except HubError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for f in findings:
        print(f.line())
    bad = [f for f in findings if not f.ok]
    print(f"{len(findings)} files, {len(bad)} to fix")
    if args.write:
        print(f"recorded {write_sizes(findings, args.catalog)} sizes in {args.catalog}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

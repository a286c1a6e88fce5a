"""The pair's calibrations on disk: what each drafter's decodes cost on this machine
(engine/control/costs.py `Calibration`, its measured widths only), kept in a folder of its own,
`calibrations/<key id>.json` in the model store (`calibrations_dir`; `TANDEM_CALIBRATIONS`
overrides it), so that a new process (serve, ui, generate, bench) starts from them and its first
answer pays no calibration. No other store reads that folder, and this one reads only the file
of its pair.

It is kept for one identity: the evidence's (loading/evidence.py `identity`: the pair's files,
its models as loaded, the machine, the build) and the load's settings that change how fast a
decode runs (`settings`: threads, GPU layers, batch size, flash attention, KV cache type, RPC
workers, the early-exit depth, the GPU). A file of another identity is stale: it is not read,
and the next keep replaces it. A file that cannot be parsed is set aside with one warning line,
and an entry that does not hold a whole calibration, or was measured at fewer widths than this
build times (`Calibration.covers`), counts as none: either way the drafter is measured again,
never refused. A calibration taken while the machine was busy
(`Calibration.busy`) is said so in one line and not kept, so a later process measures again. The
file is written atomically and user-only (models/atomic.py), like the evidence. Each entry says
when it was measured, and the file says where the calibration each drafter runs with in this
process came from (`CalibrationFile.origin`: kept by an earlier process, measured by this one and
kept, or measured on a busy machine and not kept), which the side-by-side tab shows beside its
ceiling.
"""
from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from engine.control.costs import Calibration
from engine.pair import Pair
from loading.evidence import identity
from loading.plan import LoadPlan
from models.atomic import set_aside, write_text
from models.tandem_store import store_dir, writable_dir
from models.tuned import PairKey

FORMAT = 1


def now_utc() -> str:
    """The time a calibration is kept, as its entry says it: UTC, to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


@dataclass(frozen=True)
class Origin:
    """Where the calibration a drafter runs with in this process came from: when it was
    measured (None: an entry kept before entries said so), the file it is kept in (None: not
    kept), whether an earlier process measured it, and why it was not kept (a busy machine's
    line, or that the store could not be written; "" when kept)."""
    measured: str | None
    kept: Path | None
    earlier: bool
    not_kept: str = ""


def calibrations_dir() -> Path:
    """`calibrations/` in the model store; `TANDEM_CALIBRATIONS` overrides it (the test suite
    points it at an empty folder)."""
    env = os.environ.get("TANDEM_CALIBRATIONS")
    return writable_dir(Path(env) if env else store_dir() / "calibrations")


def calibrations_path(key: PairKey) -> Path:
    """Where the calibrations of the pair `key` are kept: `calibrations/<key id>.json`."""
    return calibrations_dir() / f"{key.id}.json"


def settings(plan: LoadPlan) -> dict:
    """The load's settings a decode's speed depends on, per model, and the GPU planned for."""
    models = {"target": plan.target, "draft": plan.draft}
    out: dict = {role: {"threads": c.n_threads, "gpu_layers": c.n_gpu_layers,
                        "batch": c.n_batch, "flash_attn": c.flash_attn, "kv_type": c.kv_type,
                        "rpc": list(c.rpc)}
                 for role, c in models.items() if c is not None}
    out["early_exit"] = [plan.early_exit_layers, plan.early_exit_gpu_layers]
    m = plan.machine
    out["gpu"] = [m.gpu_name, m.gpu_total] if m is not None and m.gpu_name else None
    return out


def _points(entry: object) -> dict[int, float]:
    """Measured widths as stored, [[width, ms], ...] with widths rising from 1 and costs
    positive; ValueError otherwise."""
    if not isinstance(entry, list):
        raise ValueError("not a list of points")
    points: dict[int, float] = {}
    for item in entry:
        if (not isinstance(item, list) or len(item) != 2 or type(item[0]) is not int
                or not isinstance(item[1], (int, float)) or isinstance(item[1], bool)):
            raise ValueError("not a [width, ms] point")
        w, ms = item[0], float(item[1])
        if w <= max(points, default=0) or not math.isfinite(ms) or ms <= 0:
            raise ValueError("widths must rise and costs be positive")
        points[w] = ms
    if points and min(points) != 1:
        raise ValueError("no cost of one token")
    return points


def restored(entry: object) -> Calibration:
    """The calibration of a stored entry; ValueError when it does not hold a whole one."""
    if not isinstance(entry, dict):
        raise ValueError("not an entry")
    verify = _points(entry.get("verify"))
    if not verify:
        raise ValueError("no verify costs")
    name = entry.get("model_name")
    if name is not None and not isinstance(name, str):
        raise ValueError("model name is not a string")
    return Calibration.from_points(verify, _points(entry.get("draft")) or None, model_name=name)


def stored(calibration: Calibration) -> dict:
    verify, draft = calibration.points()
    return {"model_name": calibration.model_name,
            "verify": [[w, ms] for w, ms in verify.items()],
            "draft": [[w, ms] for w, ms in draft.items()]}


class CalibrationFile:
    """One pair's calibrations file (an engine/knowledge.py `CalibrationStore`): `restore`
    gives a drafter's when it was kept for the same model and is wide enough, `keep` writes one
    just measured beside the others, atomically. With `reuse` False nothing is restored (`tandem
    calibrate` measures anew) but every calibration is still kept."""

    def __init__(self, path: Path, ident: dict, reuse: bool = True) -> None:
        self.path = path
        self.identity = ident
        self.reuse = reuse
        # What this process kept, or the busy line of what it would not (None: neither yet).
        self.kept: str | None = None
        self._origins: dict[str, Origin] = {}
        # `keep` reads the file, adds one drafter and writes it back: two drafters kept at once
        # (slots calibrating together) go one at a time, so neither write drops the other's.
        self._lock = threading.Lock()

    def origin(self, name: str) -> Origin | None:
        """Where drafter `name`'s calibration came from, the last one this file gave or was
        handed in this process (None: neither)."""
        return self._origins.get(name)

    def _drafters(self) -> dict:
        """The file's entries when it is of this identity (read at each call: another process
        may have kept its own since); a file that cannot be parsed is set aside."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError:
            return {}
        try:
            found = json.loads(text)
            if (not isinstance(found, dict) or found.get("format") != FORMAT
                    or not isinstance(found.get("drafters"), dict)):
                raise ValueError("not a calibrations file")
        except ValueError as exc:
            set_aside(self.path, "the calibrations file", exc)
            return {}
        return dict(found["drafters"]) if found.get("identity") == self.identity else {}

    def restore(self, name: str, model: str, widths: int) -> Calibration | None:
        if not self.reuse:
            return None
        entry = self._drafters().get(name)
        if not isinstance(entry, dict) or entry.get("model") != model:
            return None
        try:
            found = restored(entry)
        except ValueError:
            return None
        if len(found.verify_ms) < widths or not found.covers(widths):
            return None
        measured = entry.get("measured")
        self._origins[name] = Origin(measured if isinstance(measured, str) else None,
                                     self.path, earlier=True)
        return found

    def keep(self, name: str, model: str, calibration: Calibration) -> None:
        measured = now_utc()
        if calibration.busy:
            self.kept = calibration.busy
            self._origins[name] = Origin(measured, None, earlier=False,
                                         not_kept=calibration.busy)
            print(f"note: {calibration.busy}; this calibration is used but not kept, and the "
                  "next process measures again", file=sys.stderr, flush=True)
            return
        try:
            with self._lock:
                drafters = self._drafters()
                drafters[name] = {"model": model, "measured": measured, **stored(calibration)}
                text = json.dumps({"format": FORMAT, "identity": self.identity,
                                   "drafters": drafters})
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_text(self.path, text, private=True)
        except OSError:
            # A store that cannot be written costs the next process a calibration, not this
            # answer.
            self._origins[name] = Origin(measured, None, earlier=False,
                                         not_kept="the store could not be written")
            return
        self.kept = str(self.path)
        self._origins[name] = Origin(measured, self.path, earlier=False)


def keep_calibrations(pair: Pair, key: PairKey, plan: LoadPlan,
                      reuse: bool = True) -> CalibrationFile:
    """Let `pair`'s drafters start from the calibrations kept for it on this machine with these
    settings (unless `reuse` is False), and keep there every one it measures."""
    kept = CalibrationFile(calibrations_path(key), {**identity(key, pair),
                                                    "settings": settings(plan)}, reuse)
    pair.knowledge.keep_calibrations_in(kept)
    return kept

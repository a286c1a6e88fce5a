"""Using pairing records at load time (CLI generate, the app, serve): find the record for the
files being loaded, hand back its configuration as overrides (request settings for the
RunSpec, app/runtime/request.py, and load options) unless the user chose one, warn when the
draft was tuned for another version of the target, and give the acceptance the generation is
watched against (engine/staleness.py). How a load treats the record is a value, `PairingRule`,
that app/runtime/open_pair.py follows for every command."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from app.runtime.defaults import LOAD, NEEDS_DRAFT_MODEL, PLAIN, SPECULATION_OPTIONS
from engine.backend import ModelConfig
from engine.errors import ModelFileError
from engine.staleness import StaleDraftEvent
from models.candidate import Candidate
from loading.derived.early_exit import default_layers
from loading.derived.files import file_sha256
from loading.options import LoadOptions
from loading.plan import LoadPlan
from models.tuned import PairingRecord, PairKey, adapted_draft, find, stale_for


# The rules a load may follow for the pairing record of its files.
COMMAND = "command"   # `tandem generate` and `serve`: for_command
PAGE = "page"         # the app's loads: for_load
IGNORED = "ignored"   # not looked up, no evidence kept: the command measures drafters itself


@dataclass(frozen=True)
class PairingRule:
    """How a load treats the pairing record `tandem tune` wrote for its files: `mode` COMMAND
    applies it unless the command line `chose_speculation` or said `no_pairing` (and then
    loads no draft model its drafter does not use); PAGE applies it unless the load options
    chose a draft variant or depth (the draft stays, for the page's other drafters); IGNORED
    neither looks it up nor keeps evidence, and the load says so, with `why`."""
    mode: str = COMMAND
    chose_speculation: bool = False
    no_pairing: bool = False
    why: str = ""

    @classmethod
    def ignored(cls, why: str) -> "PairingRule":
        return cls(IGNORED, why=why)

    @property
    def looks_up(self) -> bool:
        return self.mode != IGNORED

    def not_used_line(self) -> str:
        """What an IGNORED load prints with its plan."""
        return f"pairing record: not used ({self.why})"


@dataclass
class PairingUse:
    record: PairingRecord | None = None
    stale: list[PairingRecord] = field(default_factory=list)
    applied: bool = False
    messages: list[str] = field(default_factory=list)
    # The files' key (None when a file is missing): the controller's evidence is kept under
    # it too (loading/evidence.py).
    key: PairKey | None = None

    @property
    def reference(self) -> PairingRecord | None:
        """The record acceptance is compared with: the matching one, else the newest stale."""
        return self.record or (self.stale[0] if self.stale else None)

    @property
    def drafter(self) -> str | None:
        """The drafter the record chose, when applied."""
        return self.record.chosen.candidate.drafter if self.applied and self.record else None

    @property
    def overrides(self) -> dict[str, Any]:
        """The record's choice as request settings (app/runtime/ranges.py), when applied: the
        drafter, and its policy and gamma unless it chose plain decoding."""
        if not self.applied or self.record is None:
            return {}
        c = self.record.chosen.candidate
        if c.drafter == PLAIN:
            return {"drafter": PLAIN}
        return {"drafter": c.drafter, "policy": c.policy, "gamma": c.gamma}

    def draft_config(self, draft: ModelConfig | None) -> ModelConfig | None:
        """`draft` as the applied record loads it: the adapted draft `tandem adapt` made for
        exactly these files, where it beat the base draft (models/tuned.py `adapted_draft`)."""
        if not self.applied or self.record is None or draft is None or self.key is None:
            return draft
        adapted = adapted_draft(self.key)
        if adapted is None:
            return draft
        a = self.record.adapted
        self.messages.append(f"adapted draft {adapted.name}: {a.reason if a else ''}")
        return replace(draft, path=str(adapted))

    def load_options(self, options: LoadOptions) -> LoadOptions:
        """`options` with the record's draft variant and early-exit depth, when applied."""
        if not self.applied or self.record is None:
            return options
        c = self.record.chosen.candidate
        return replace(options, draft_quant=c.draft_quant, draft_vocab=c.draft_vocab,
                       early_exit=options.early_exit or c.drafter == "early-exit",
                       early_exit_layers=c.early_exit_layers)


def _adapters(adapters: Sequence[tuple[str, float]]) -> str:
    # The scale is part of an adapter's identity here: it changes the model as much as the file.
    return ",".join(f"{file_sha256(Path(p))}@{float(s):g}" for p, s in adapters)


def key_for(target: str | Path, draft: str | Path | None,
            adapters: Sequence[tuple[str, float]] = (),
            draft_adapters: Sequence[tuple[str, float]] = ()) -> PairKey:
    """The key of a target with its adapters and of a draft (with its own adapters, if any)."""
    d = file_sha256(Path(draft)) if draft else ""
    if d and draft_adapters:
        d += "+" + _adapters(draft_adapters)
    return PairKey(file_sha256(Path(target)), _adapters(adapters), d)


def chose_speculation(given: Mapping[str, Any]) -> bool:
    """Whether the options `given` by name (a command line's, parsed) hold a speculation
    option (they default to None, "not given"; a command without an option has none to give)."""
    return any(given.get(k) is not None for k in SPECULATION_OPTIONS)


def lookup(tcfg: ModelConfig, dcfg: ModelConfig | None) -> PairingUse:
    """The record for these files and the stale ones (same draft, other target or adapter).
    Nothing when a file is missing: loading says so, in its own words."""
    paths = [tcfg.path, *(p for p, _ in tcfg.lora)]
    if dcfg is not None:
        paths += [dcfg.path, *(p for p, _ in dcfg.lora)]
    if not all(Path(p).is_file() for p in paths):
        return PairingUse()
    key = key_for(tcfg.path, dcfg.path if dcfg else None, tcfg.lora, dcfg.lora if dcfg else ())
    try:
        use = PairingUse(find(key), stale_for(key), key=key)
    except ModelFileError as exc:
        # A damaged record costs the tuned choice, not the load.
        return PairingUse(messages=[f"warning: {exc}"], key=key)
    # With a record of its own, other versions' records are no news.
    for r in use.stale[:1] if use.record is None else ():
        use.messages.append(
            f"warning: the draft {Path(dcfg.path).name if dcfg else ''} was tuned on {r.date[:10]}"
            f" for another version of the target ({Path(r.target).name}"
            + (f" with adapter {Path(r.adapter).name}@{r.adapter_scale:g}" if r.adapter else
               " without an adapter") + "); run `tandem tune` for this one")
    return use


def for_command(use: PairingUse, chose: bool = False, no_pairing: bool = False) -> PairingUse:
    """Apply the record unless the command line `chose` speculation options or said
    --no-pairing; `use.overrides` and `use.load_options` then carry its choice."""
    if use.record is None:
        return use
    if no_pairing:
        use.messages.append(f"pairing record {use.record.key.id} not used: --no-pairing")
        return use
    if chose:
        use.messages.append(f"pairing record {use.record.key.id} not used: speculation options "
                            "given on the command line")
        return use
    use.applied = True
    c = use.record.chosen
    use.messages.append(f"using tuned pairing {use.record.key.id} ({use.record.date[:10]}): "
                        f"{c.label}, {_measured(c)}")
    return use


def _measured(c) -> str:
    if c.candidate.drafter == PLAIN:
        return "no candidate beat it"
    return f"{c.speedup_median:.2f}x measured"


def running_name(drafter: str, plan: LoadPlan) -> str:
    """The candidate name (bench/tuning/candidates.py) of `drafter` on the load `plan`
    (its derivations, decided from the headers it read)."""
    if drafter in NEEDS_DRAFT_MODEL and plan.draft is not None:
        quant = plan.draft_quant or "off"
        vocab = "trim" if plan.trim_vocab else "full"
        if drafter == "hybrid":
            # Tuning measures hybrid on the draft as given only.
            return "hybrid" if quant == "off" and vocab == "full" else ""
        return Candidate("draft", draft_quant=quant, draft_vocab=vocab).name
    if drafter == "early-exit":
        layers = plan.early_exit_layers or default_layers(plan.target_info.n_layer)
        return Candidate("early-exit", early_exit_layers=layers).name
    return drafter


def expected_acceptance(use: PairingUse, name: str) -> float | None:
    """The lowest per-category acceptance the reference record measured for `name`."""
    ref = use.reference
    if ref is None or not name or name == PLAIN:
        return None
    m = ref.measured.get(name)
    if not m or not m.get("n"):
        return None
    return float(m.get("acceptance_min", m.get("acceptance", 0.0)))


def stale_line(ev: StaleDraftEvent) -> str:
    return (f"warning: acceptance over the last {ev.drafted} drafted tokens is {ev.observed:.2f}, "
            f"well below the {ev.expected:.2f} this pairing was tuned at (threshold "
            f"{ev.threshold:.2f}); the draft may be stale for this target: run `tandem tune`")


def for_load(target: ModelConfig, draft: ModelConfig | None,
             options: LoadOptions) -> tuple[LoadOptions, PairingUse]:
    """The app's load (no command-line drafter): the record's draft variant and early-exit
    depth unless `options` chose them; its drafter, policy and gamma are then the defaults of
    the requests (`use.overrides`)."""
    use = lookup(target, draft)
    r = use.record
    if r is None or (options.draft_quant, options.draft_vocab, options.early_exit_layers) != \
            (LOAD.draft_quant, LOAD.draft_vocab, LOAD.early_exit_layers):
        return options, use
    use.applied = True
    use.messages.append(f"tuned pairing: {r.chosen.label}, {_measured(r.chosen)} ({r.date[:10]})")
    return use.load_options(options), use


def chosen_acceptance(use: PairingUse, drafter: str) -> float | None:
    """The acceptance to watch a generation of `drafter` against, when it is the tuned choice."""
    if not use.applied or use.record is None or drafter != use.record.chosen.candidate.drafter:
        return None
    return expected_acceptance(use, use.record.chosen.candidate.name)

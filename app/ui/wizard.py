"""The models tab: a step-by-step wizard over the models library. Choose a target (catalog, a
model already on this machine, hub search or a local file), see suggested drafts, the memory fit
and the compatibility verdict, download with a progress bar, measure the pair's predicted ceiling
on this machine once it is on disk, then load the pair into the chat; optionally adapt the draft
to the target on the user's prompts (app/ui/adapt_action.py).

A model is named by (repo, file): a hub repository and a file in it, or an empty repo and a
local path or the name of a model found on this machine (`tandem models list`: an Ollama name
like qwen2.5-coder:7b, an HF cache or LM Studio REPO:FILE). Found models are used where they
lie. Every refusal carries the library's reason and what to do instead.

The tab's fields start from `tandem ui`'s own flags (`Start`, app/ui_cli.py): the pair it
loads, its loader settings and its LoRA adapters, so what the page shows first is what runs.
"""
from __future__ import annotations

import html
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import gradio as gr

from app.runtime.ceiling_advice import MEASURED_AS_GIVEN, suggestions
from app.runtime.defaults import CTX, FLASH_ATTN, FLASH_ATTN_CHOICES, GPU_LAYERS, KV_TYPE, KV_TYPES
from app.runtime.loader_settings import LoaderSettings
from app.runtime.holder import ERROR, LOADING, PairHolder
from app.runtime.open_pair import QUIET, PairRequest, open_pair
from app.runtime.tuned import PairingRule
from app.ui.adapt_action import AdaptStep, adapt_draft
from bench.adapt.settings import Settings
from engine.backend import ModelConfig
from bench.ceiling import TYPICAL_ACCEPTANCE, Ceiling, measure
from engine.errors import DoesNotFitError, TandemError
from models import budget, catalog, compat, disk_pairs, found, hub, machine, other_stores
from models.offload import ALL, AUTO
from models.tandem_store import store_dir

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class ModelChoice:
    repo: str
    file: str

    @property
    def label(self) -> str:
        return f"{self.repo}/{self.file}" if self.repo else self.file

    def located(self) -> other_stores.Located | None:
        """The model found on this machine that this choice names (not a path nor a hub file)."""
        if not self.file or self.repo or Path(self.file).expanduser().is_file():
            return None
        item = other_stores.find(self.file)
        return item if item is not None and not item.problem else None

    def found_name(self) -> str:
        """The found model's name, for messages and the API; "" when chosen otherwise."""
        item = self.located()
        return item.name if item is not None else ""

    def local_path(self) -> Path | None:
        """Where this model already is on disk, if anywhere."""
        if not self.file:
            return None
        if not self.repo:
            p = Path(self.file).expanduser()
            item = self.located()
            return p if p.is_file() else item.path if item is not None else None
        for entry in catalog.load_catalog():
            paths = entry.local_paths()
            for model, ref, path in ((entry.target, entry.target_file, paths[0]),
                                     (entry.draft, entry.draft_file, paths[1])):
                if model.repo == self.repo and ref.filename == self.file and path.is_file():
                    return path
        p = store_dir() / Path(self.file).name
        return p if p.is_file() else None

    def approx_size(self) -> int | None:
        local = self.local_path()
        if local is not None:
            return local.stat().st_size
        model = catalog.find_model(self.repo)
        if model is not None:
            for ref in model.files.values():
                if ref.filename == self.file:
                    return ref.approx_size
        return None


@dataclass(frozen=True)
class Start:
    """What the tab's fields hold when the page opens: the target and draft (a path or a found
    model's name; an empty draft: none), the loader's settings and each model's LoRA adapter
    (path, scale). The defaults are app/runtime/defaults.py's."""
    target: str = ""
    draft: str = ""
    settings: LoaderSettings = field(default_factory=LoaderSettings)
    lora: tuple[str, float] = ("", 1.0)
    draft_lora: tuple[str, float] = ("", 1.0)


def _pair_label(p: catalog.PairEntry) -> str:
    where = "embedded, on disk" if p.offline else ("on disk" if p.is_local() else
                                                  f"~{(p.target_file.approx_size + p.draft_file.approx_size) / GIB:.1f} GiB download")
    return f"{p.target.name} {p.target_quant} + {p.draft.name} {p.draft_quant} ({where})"


def catalog_rows() -> list[list[Any]]:
    """One row per curated pair: id, target, draft, download size in MiB, whether it is on disk."""
    return [[p.id, f"{p.target.name} {p.target_quant}", f"{p.draft.name} {p.draft_quant}",
             round((p.target_file.approx_size + p.draft_file.approx_size) / MIB),
             "yes" if p.is_local() else "no"] for p in catalog.load_catalog()]


def pick_pair(pair_id: str) -> tuple[str, str, str, str, str]:
    """Target and draft fields for a catalog pair, and a note about it."""
    p = catalog.find_pair(pair_id)
    note = f"**{html.escape(p.family)}** pair `{p.id}`" + (f": {html.escape(p.note)}" if p.note else "")
    return p.target.repo, p.target_file.filename, p.draft.repo, p.draft_file.filename, note


def suggest_drafts(target_repo: str) -> list[tuple[str, str]]:
    """(label, "repo|file") for drafts the catalog pairs with this target, then same-family drafts."""
    entries = catalog.load_catalog()
    exact = [e for e in entries if e.target.repo == target_repo]
    families = {e.family for e in exact}
    name = target_repo.lower()
    if not families:
        families = {e.family for e in entries if e.family.lower().split()[0] in name}
    seen: dict[str, str] = {}
    for e in exact + [e for e in entries if e.family in families]:
        key = f"{e.draft.repo}|{e.draft_file.filename}"
        if key not in seen:
            seen[key] = f"{e.draft.name} {e.draft_quant}" + (" (catalog pair)" if e in exact else f" ({e.family})")
    return [(label, key) for key, label in seen.items()]


class FoundList:
    """The models found on this machine (models/found.py) as this tab shows them. A scan reads
    every header, so it is kept until the Rescan button asks for a new one."""

    def __init__(self) -> None:
        self.scan = found.scan()

    def refresh(self) -> None:
        self.scan = found.scan()

    def rows(self) -> list[list[str]]:
        return [m.cells() for m in self.scan.models]

    def choices(self) -> list[tuple[str, str]]:
        return [(f"{m.name} · {m.where} · {m.architecture} {m.parameters} {m.quant}"
                 f" · {found.size_text(m.size)}", m.name) for m in self.scan.usable]

    def model(self, name: str) -> found.FoundModel | None:
        return next((m for m in self.scan.usable if m.name == name), None)

    def drafts(self, name: str) -> list[tuple[str, str]]:
        """(label, "|name") for the drafts on disk that compat accepts for this found model,
        best first, each with the memory verdict."""
        target = self.model(name)
        if target is None:
            return []
        return [(d.label(), f"|{d.draft.name}") for d in disk_pairs.drafts_for(target, self.scan.usable)]

    def note(self, name: str, n_drafts: int) -> str:
        m = self.model(name)
        if m is None:
            return ""
        drafts = (f"{n_drafts} compatible draft{'s' if n_drafts != 1 else ''} on disk, best first"
                  if n_drafts else "no smaller compatible draft on disk: pick one from the catalog or the hub")
        return (f"**{html.escape(m.name)}** ({html.escape(m.where)}, used where it lies:"
                f" `{html.escape(str(m.path))}`): {drafts}")


def _fit_html(target: ModelChoice, draft: ModelChoice, settings: LoaderSettings) -> tuple[str, bool]:
    tpath, dpath = target.local_path(), draft.local_path()
    if tpath is not None and dpath is not None:
        report, plan = settings.plan(tpath, dpath)
        verdict = {"fits": "fits", "fits with offload": "fits with GPU offload"}.get(report.verdict, "does not fit")
        advice = "".join(f"<li>{html.escape(s)}</li>" for s in report.suggestions)
        return (f"<p><b>Memory: {verdict}</b> (from the GGUF headers)</p>"
                f"<p id='tandem-offload-plan'>GPU: {html.escape(plan.line())}</p>"
                f"<pre style='font-size:.8em'>{html.escape(report.text())}</pre>"
                + (f"<p>What to do instead:</p><ul>{advice}</ul>" if advice and not report.ok else ""), report.ok)
    sizes = [target.approx_size(), draft.approx_size()]
    m = machine.detect()
    if None in sizes:
        return ("<p><b>Memory: unknown before download</b>: the hub did not tell this file's size; the exact "
                f"breakdown appears once both files are on disk. This machine has {html.escape(m.describe())}.</p>", True)
    weights = sum(s for s in sizes if s)
    room = m.ram_available * budget.RAM_SHARE + (m.gpu_free * budget.GPU_SHARE if m.has_gpu and not m.unified else 0)
    ok = weights < room
    return (f"<p><b>Memory: {'likely fits' if ok else 'does not fit'}</b> (rough, from file sizes: weights "
            f"{weights / GIB:.2f} GiB plus KV cache and buffers; the exact breakdown appears after download). "
            f"This machine has {html.escape(m.describe())}.</p>"
            + ("" if ok else "<p>What to do instead: pick a smaller target or quantization (Q4_K_M is about half "
               "of Q8_0), or free memory.</p>"), ok)


def _compat_html(target: ModelChoice, draft: ModelChoice) -> tuple[str, bool]:
    tpath, dpath = target.local_path(), draft.local_path()
    if tpath is not None and dpath is not None:
        report = compat.check_pair(tpath, dpath)
        items = "".join(f"<li>{html.escape(line)}</li>" for line in report.lines())
        advice = ("<p>What to do instead: pick a draft from the same model family (same tokenizer); "
                  "the suggested drafts above are.</p>" if not report.ok else "")
        return (f"<p><b>Compatibility: {report.verdict}</b>: {html.escape(report.summary)}</p>"
                + (f"<ul>{items}</ul>" if items else "") + advice, report.ok)
    curated = any(e.target.repo == target.repo and e.target_file.filename == target.file
                  and e.draft.repo == draft.repo and e.draft_file.filename == draft.file
                  for e in catalog.load_catalog())
    if curated:
        return ("<p><b>Compatibility: curated pair</b>: the catalog lists these two as compatible; the "
                "headers are checked again before loading.</p>", True)
    return ("<p><b>Compatibility: checked after download</b>: it is read from both GGUF headers "
            "(tokenizer, vocabulary, special tokens).</p>", True)


def check(target_repo: str, target_file: str, draft_repo: str, draft_file: str,
          n_ctx: float, gpu_layers: str = GPU_LAYERS, draft_gpu_layers: str = GPU_LAYERS,
          flash_attn: str = FLASH_ATTN, kv_type: str = KV_TYPE) -> tuple[str, dict]:
    """The fit (with the loader's settings) and compatibility verdicts as HTML, and as data
    for API callers."""
    target, draft = ModelChoice(target_repo.strip(), target_file.strip()), ModelChoice(draft_repo.strip(), draft_file.strip())
    if not target.file or not draft.file:
        raise gr.Error("choose a target and a draft first")
    absent = [f"{role} {c.file} is neither a file nor a model found on this machine"
              for role, c in (("target", target), ("draft", draft)) if not c.repo and c.local_path() is None]
    if absent:
        reason = ("; ".join(absent) + "; give an existing path, a name from the models on this"
                  " machine, or a hub repo and file name")
        return f"<p><b>Refused:</b> {html.escape(reason)}</p>", {"ok": False, "reason": reason}
    try:
        settings = LoaderSettings(gpu_layers, draft_gpu_layers, int(n_ctx), flash_attn, kv_type)
        fit, fit_ok = _fit_html(target, draft, settings)
        comp, comp_ok = _compat_html(target, draft)
    except TandemError as exc:
        return f"<p><b>Refused:</b> {html.escape(str(exc))}</p>", {"ok": False, "reason": str(exc)}
    missing = [c.label for c in (target, draft) if c.local_path() is None]
    todo = (f"<p>To download: {html.escape(', '.join(missing))}</p>" if missing
            else "<p>Both files are on disk: load the pair.</p>")
    return (f'<div class="tandem-check">{fit}{comp}{todo}</div>',
            {"ok": fit_ok and comp_ok, "fits": fit_ok, "compatible": comp_ok, "missing": missing})


def _plan_refusal(report: budget.BudgetReport) -> str | None:
    """Why settings do not fit as set, in the plan's one line: a pair that does not fit, or GPU
    layers given as numbers that only another split would fit (the line names it)."""
    if report.verdict == "fits":
        return None
    return report.one_line()


def plan_html(target_repo: str, target_file: str, draft_repo: str, draft_file: str,
              n_ctx: float, gpu_layers: str = GPU_LAYERS, draft_gpu_layers: str = GPU_LAYERS,
              flash_attn: str = FLASH_ATTN, kv_type: str = KV_TYPE) -> str:
    """The plan the loader's settings make for the chosen files, before anything loads: its
    line, or why the settings do not fit (the plan's one-line reason)."""
    target = ModelChoice(target_repo.strip(), target_file.strip())
    draft = ModelChoice(draft_repo.strip(), draft_file.strip())
    tpath, dpath = target.local_path(), draft.local_path()
    if tpath is None or (draft.file and dpath is None):
        return "<p>The plan appears once the files are on disk.</p>"
    try:
        settings = LoaderSettings(gpu_layers, draft_gpu_layers, int(n_ctx), flash_attn, kv_type)
        report, plan = settings.plan(tpath, dpath)
    except TandemError as exc:
        return f"<p><b>Refused:</b> {html.escape(str(exc))}</p>"
    refusal = _plan_refusal(report)
    if refusal is not None:
        return f"<p><b>Does not fit as set:</b> {html.escape(refusal)}</p>"
    return f"<p><b>Plan:</b> {html.escape(plan.line())}</p>"


def ceiling_html(c: Ceiling, has_draft: bool = True) -> str:
    """The pair's predicted ceiling on this machine, from the engine's figures."""
    rows = "".join(
        f"<tr><td>{g}</td>"
        + (f"<td>{c.model[g]:.2f}x</td><td>{c.model_typical[g]:.2f}x</td>" if has_draft else "")
        + f"<td>{c.lookup[g]:.2f}x</td><td>{c.lookup_typical[g]:.2f}x</td></tr>"
        for g in range(1, len(c.model)))
    head = ("<tr><th>gamma</th>" + ("<th>draft model, all accepted</th><th>at "
            f"{TYPICAL_ACCEPTANCE}</th>" if has_draft else "")
            + f"<th>prompt lookup, all accepted</th><th>at {TYPICAL_ACCEPTANCE}</th></tr>")
    one = c.verify_ms[0]
    costs = (f"<p>Verify cost per batch width, relative to one token ({one:.0f} ms): "
             + " ".join(f"{v / one:.2f}" for v in c.verify_ms) + "."
             + (f" The draft costs {c.draft_relative:.2f} of a target token." if has_draft else "")
             + "</p>")
    if has_draft:
        g = c.best(c.model_typical)
        verdict = (f"<p><b>Predicted ceiling</b>: the draft model {'pays' if c.model_pays else 'cannot pay'}"
                   f" on this machine (best {c.model_typical[g]:.2f}x at gamma {g} at acceptance "
                   f"{TYPICAL_ACCEPTANCE}).</p>")
    else:
        verdict = "<p><b>Predicted ceiling</b> of prompt lookup on this machine.</p>"
    tips = suggestions(c, has_draft)
    advice = ("<p>What might pay instead:</p><ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in tips)
              + "</ul>") if tips else ""
    return (f'<div class="tandem-ceiling">{verdict}{costs}<table>{head}{rows}</table>{advice}</div>')


def measure_ceiling(target_repo: str, target_file: str, draft_repo: str, draft_file: str,
                    n_ctx: float) -> str:
    """Load the pair (both files on disk), calibrate it and show its predicted ceiling."""
    target, draft = ModelChoice(target_repo.strip(), target_file.strip()), ModelChoice(draft_repo.strip(), draft_file.strip())
    tpath, dpath = target.local_path(), draft.local_path()
    if tpath is None or (draft.file and dpath is None):
        return "<p><b>Not on disk yet</b>: download the pair first (step 4), then measure.</p>"
    ctx = int(n_ctx)
    try:
        pair = open_pair(PairRequest(ModelConfig(str(tpath), n_ctx=ctx),
                                     ModelConfig(str(dpath), n_ctx=ctx) if dpath else None,
                                     pairing=PairingRule.ignored(MEASURED_AS_GIVEN), say=QUIET)).pair
        try:
            c = measure(pair)
        finally:
            pair.close()
    except TandemError as exc:
        return f"<p><b>Refused:</b> {html.escape(str(exc))}</p>"
    return ceiling_html(c, has_draft=dpath is not None)


def download(target_repo: str, target_file: str, draft_repo: str, draft_file: str,
             progress: gr.Progress = gr.Progress()) -> str:
    """Pull whichever of the two files is not on disk yet, with a progress bar per file."""
    choices = [ModelChoice(target_repo.strip(), target_file.strip()), ModelChoice(draft_repo.strip(), draft_file.strip())]
    done = []
    for role, c in zip(("target", "draft"), choices):
        if c.local_path() is not None:
            done.append(f"{role} {c.label}: already on disk")
            continue
        if not c.repo:
            raise gr.Error(f"the {role} {c.file} is neither a file nor a model found on this machine;"
                           " give an existing path, a found model's name or a hub repo")
        progress(0.0, desc=f"downloading {role} {c.file}")

        def report(n: int, total: int, role: str = role, name: str = c.file) -> None:
            progress((n / total) if total else 0.0, desc=f"{role} {name}: {n / MIB:.0f} of {total / MIB:.0f} MiB")

        try:
            path = hub.pull(c.repo, c.file, progress=report)
        except TandemError as exc:
            raise gr.Error(str(exc)) from None
        done.append(f"{role} {c.label}: downloaded and verified at {path}")
    return "<br>".join(html.escape(d) for d in done)


def search(query: str) -> tuple[dict, str]:
    if not query or not query.strip():
        raise gr.Error("type part of a model name to search for")
    try:
        hits = hub.search(query.strip())
    except TandemError as exc:
        return gr.update(choices=[], value=None), f"<p><b>Hub search failed:</b> {html.escape(str(exc))}</p>"
    choices = [(f"{h.repo_id} ({h.downloads or 0} downloads)", h.repo_id) for h in hits]
    note = f"<p>{len(hits)} GGUF repositories</p>" if hits else "<p>no GGUF repositories match</p>"
    return gr.update(choices=choices, value=choices[0][1] if choices else None), note


def files(repo: str) -> tuple[dict, str]:
    if not repo:
        return gr.update(choices=[], value=None), ""
    try:
        found = hub.list_gguf_files(repo)
    except TandemError as exc:
        return gr.update(choices=[], value=None), f"<p><b>Listing failed:</b> {html.escape(str(exc))}</p>"
    choices = [(f"{f.quant} · {f.filename} · {f.size / MIB:.0f} MiB", f.filename) for f in found]
    return gr.update(choices=choices, value=choices[0][1] if choices else None), f"<p>{len(found)} GGUF files</p>"


def _adapters(path: str, scale: float) -> tuple[tuple[str, float], ...]:
    """A LoRA field's (path, scale) list: empty when no path is given."""
    path = (path or "").strip()
    return ((str(Path(path).expanduser()), float(scale)),) if path else ()


def _configs(target: ModelChoice, draft: ModelChoice, tpath: Path, dpath: Path | None,
             settings: LoaderSettings, adapters: tuple) -> tuple[ModelConfig, ModelConfig | None]:
    """The configs to load, with the loader's settings; DoesNotFitError (the plan's one-line
    reason) when they do not fit as set, before anything loads."""
    report, _ = settings.plan(tpath, dpath)
    refusal = _plan_refusal(report)
    if refusal is not None:
        raise DoesNotFitError(refusal)
    return settings.configs(
        ModelConfig(str(tpath), lora=adapters[0], name=target.found_name()),
        ModelConfig(str(dpath), lora=adapters[1], name=draft.found_name())
        if dpath is not None else None)


def load_pair(holder: PairHolder, target_repo: str, target_file: str, draft_repo: str, draft_file: str,
              n_ctx: float, lora: str = "", lora_scale: float = 1.0, draft_lora: str = "",
              draft_lora_scale: float = 1.0,
              settings: LoaderSettings | None = None) -> Iterator[str]:
    """Load the chosen pair into the chat with the loader's `settings` (`n_ctx` its context),
    yielding the loading status until it ends. `lora` and `draft_lora` are GGUF LoRA adapters
    (local paths) for the target and the draft."""
    target, draft = ModelChoice(target_repo.strip(), target_file.strip()), ModelChoice(draft_repo.strip(), draft_file.strip())
    tpath, dpath = target.local_path(), draft.local_path()
    if tpath is None or (draft.file and dpath is None):
        missing = ", ".join(c.label for c, p in ((target, tpath), (draft, dpath)) if c.file and p is None)
        yield f"<p><b>Refused:</b> not on disk yet: {html.escape(missing)}; download first (step 4).</p>"
        return
    chosen = replace(settings or LoaderSettings(), ctx=int(n_ctx))
    try:
        holder.load_async(*_configs(target, draft, tpath, dpath, chosen,
                                    (_adapters(lora, lora_scale),
                                     _adapters(draft_lora, draft_lora_scale))))
    except TandemError as exc:
        yield f"<p><b>Refused:</b> {html.escape(str(exc))}</p>"
        return
    while holder.status.state == LOADING:
        s = holder.status
        yield f"<p>loading ({s.step + 1}/{len(s.steps)}): {html.escape(s.message)} · {s.elapsed_s:.0f} s</p>"
        time.sleep(0.3)
    holder.wait()
    s = holder.status
    if s.state == ERROR or s.error:
        yield f"<p><b>Refused:</b> {html.escape(s.error or s.message)}</p>"
    else:
        yield f"<p><b>Loaded</b> {html.escape(s.target)} + {html.escape(s.draft)}: {html.escape(s.message)}. Go to the Chat tab.</p>"


class Steps:
    """The tab's five steps and two lists as components, laid out in the current Blocks by
    one method each; `wire` connects them to the library."""

    def __init__(self, start: Start) -> None:
        self.start = start
        self.on_disk = FoundList()
        self.choose_target()
        self.choose_draft()
        self.check_pair()
        with gr.Group():
            gr.Markdown("### 4. Download")
            self.download_btn = gr.Button("Download what is missing", elem_id="wizard-download")
            self.download_note = gr.HTML()
        self.load_step()
        self.adapt = AdaptStep()
        self.lists()
        self.fields = [self.target_repo, self.target_file, self.draft_repo, self.draft_file]

    def choose_target(self) -> None:
        with gr.Group():
            gr.Markdown("### 1. Choose a target")
            self.pair = gr.Dropdown(choices=[(_pair_label(p), p.id) for p in catalog.load_catalog()],
                                    value=None, label="from the catalog (curated target + draft pairs)",
                                    elem_id="wizard-pair")
            with gr.Row():
                self.found_pick = gr.Dropdown(
                    choices=self.on_disk.choices(), value=None, scale=4, elem_id="wizard-found",
                    label="or a model already on this machine (HF cache, LM Studio, Ollama, "
                    "llama.cpp, your folders; used where it lies)")
                self.rescan_btn = gr.Button("Rescan", scale=1, size="sm", elem_id="wizard-rescan")
            with gr.Row():
                self.query = gr.Textbox(label="or search the hub", scale=3,
                                        placeholder="e.g. qwen2.5 coder gguf")
                self.search_btn = gr.Button("Search", scale=1)
            with gr.Row():
                self.repo = gr.Dropdown(choices=[], label="repository", allow_custom_value=True)
                self.repo_file = gr.Dropdown(choices=[], label="quantization / file",
                                             allow_custom_value=True)
            self.hub_note = gr.HTML()
            with gr.Row():
                self.target_repo = gr.Textbox(label="target repo (empty for a local file)",
                                              elem_id="wizard-target-repo")
                self.target_file = gr.Textbox(label="target file (or local path)",
                                              value=self.start.target,
                                              elem_id="wizard-target-file")
            self.pair_note = gr.Markdown()

    def choose_draft(self) -> None:
        with gr.Group():
            gr.Markdown("### 2. Choose a draft")
            self.drafts = gr.Dropdown(choices=[], label="suggested drafts (same family and tokenizer)",
                                      allow_custom_value=True)
            with gr.Row():
                self.draft_repo = gr.Textbox(label="draft repo (empty for a local file)",
                                             elem_id="wizard-draft-repo")
                self.draft_file = gr.Textbox(label="draft file (or local path)",
                                             value=self.start.draft, elem_id="wizard-draft-file")

    def check_pair(self) -> None:
        with gr.Group():
            gr.Markdown("### 3. Loader settings, memory fit and compatibility")
            self.loader_settings()
            with gr.Row():
                self.check_btn = gr.Button("Check", variant="secondary", elem_id="wizard-check")
            self.report = gr.HTML(elem_id="wizard-report")
            self.verdict = gr.JSON(visible=False)
            with gr.Row():
                self.ceiling_btn = gr.Button("Measure ceiling", variant="secondary",
                                             elem_id="wizard-ceiling")
            self.ceiling_note = gr.HTML(elem_id="wizard-ceiling-note")

    def loader_settings(self) -> None:
        """The loader's settings, each labelled with its CLI option (and API name), and the
        plan they make, updated as they change."""
        layers, given = [AUTO, ALL], self.start.settings
        with gr.Row():
            self.gpu_layers = gr.Dropdown(layers, value=given.gpu_layers, allow_custom_value=True,
                                          label="target GPU layers --gpu-layers",
                                          info="auto, all or a number",
                                          elem_id="wizard-gpu-layers")
            self.draft_gpu_layers = gr.Dropdown(
                layers, value=given.draft_gpu_layers, allow_custom_value=True,
                info="auto, all or a number",
                label="draft GPU layers --draft-gpu-layers", elem_id="wizard-draft-gpu-layers")
            self.n_ctx = gr.Number(value=given.ctx, precision=0, label="context length --ctx",
                                   elem_id="wizard-ctx")
            self.flash_attn = gr.Dropdown(list(FLASH_ATTN_CHOICES), value=given.flash_attn,
                                          label="flash attention --flash-attn",
                                          elem_id="wizard-flash-attn")
            self.kv_type = gr.Dropdown(list(KV_TYPES), value=given.kv_type,
                                       label="KV cache type --kv-type", elem_id="wizard-kv-type")
        self.plan_note = gr.HTML(elem_id="wizard-plan")
        self.settings = [self.n_ctx, self.gpu_layers, self.draft_gpu_layers, self.flash_attn,
                         self.kv_type]

    def load_step(self) -> None:
        with gr.Group():
            gr.Markdown("### 5. Load into the chat")
            (lora, scale), (draft_lora, draft_scale) = self.start.lora, self.start.draft_lora
            with gr.Row():
                self.lora = gr.Textbox(lora, label="target LoRA adapter (GGUF path, optional)",
                                       elem_id="wizard-lora", scale=3)
                self.lora_scale = gr.Number(value=scale, label="scale",
                                            elem_id="wizard-lora-scale", scale=1)
                self.draft_lora = gr.Textbox(draft_lora, elem_id="wizard-draft-lora", scale=3,
                                             label="draft LoRA adapter (GGUF path, optional)")
                self.draft_lora_scale = gr.Number(value=draft_scale, label="scale", scale=1)
            self.load_btn = gr.Button("Load pair", variant="primary", elem_id="wizard-load")
            self.load_note = gr.HTML(elem_id="wizard-load-note")

    def lists(self) -> None:
        with gr.Accordion("models on this machine", open=False):
            self.found_where = gr.Markdown(f"Searched {self.on_disk.scan.where_searched()}.")
            self.found_table = gr.Dataframe(value=self.on_disk.rows(), headers=list(found.COLUMNS),
                                            interactive=False, elem_id="wizard-found-table")
        with gr.Accordion("catalog", open=False):
            self.table = gr.Dataframe(value=catalog_rows(), interactive=False,
                                      headers=["id", "target", "draft", "MiB", "on disk"],
                                      elem_id="wizard-catalog")
            self.catalog_btn = gr.Button("Refresh catalog", size="sm")

    def on_pair(self, pair_id: str | None):
        if not pair_id:
            return [gr.update()] * 5 + [gr.update()]
        t_repo, t_file, d_repo, d_file, note = pick_pair(pair_id)
        return (t_repo, t_file, d_repo, d_file, note,
                gr.update(choices=suggest_drafts(t_repo), value=f"{d_repo}|{d_file}"))

    def on_found(self, name: str | None):
        if not name:
            return [gr.update()] * 4
        choices = self.on_disk.drafts(name)
        return ("", name, self.on_disk.note(name, len(choices)),
                gr.update(choices=choices, value=choices[0][1] if choices else None))

    def on_rescan(self):
        self.on_disk.refresh()
        return (gr.update(choices=self.on_disk.choices(), value=None), self.on_disk.rows(),
                f"Searched {self.on_disk.scan.where_searched()}.")

    def wire_choices(self) -> None:
        """The pickers fill the target and draft fields."""
        private = {"api_visibility": "private"}
        self.pair.change(self.on_pair, self.pair, [*self.fields, self.pair_note, self.drafts],
                         queue=False, **private)
        self.found_pick.change(self.on_found, self.found_pick,
                               [self.target_repo, self.target_file, self.pair_note, self.drafts],
                               **private)
        self.rescan_btn.click(self.on_rescan, None,
                              [self.found_pick, self.found_table, self.found_where], api_name="found")
        self.search_btn.click(search, self.query, [self.repo, self.hub_note], api_name="search")
        self.query.submit(search, self.query, [self.repo, self.hub_note], **private)
        self.repo.change(files, self.repo, [self.repo_file, self.hub_note], api_name="files")
        self.repo_file.change(_on_file, [self.repo, self.repo_file],
                              [self.target_repo, self.target_file, self.drafts], **private)
        self.drafts.change(_on_draft, self.drafts, [self.draft_repo, self.draft_file], queue=False,
                           **private)

    def wire_actions(self, holder: PairHolder) -> Any:
        """Check, measure, download and load; returns the load event (the page follows it)."""
        fields, n_ctx = self.fields, self.n_ctx
        self.check_btn.click(check, [*fields, *self.settings], [self.report, self.verdict],
                             api_name="check")
        for part in (*fields, *self.settings):
            # The plan follows the files and the settings before anything loads.
            part.change(plan_html, [*fields, *self.settings], self.plan_note,
                        api_visibility="private")
        # Loading and timing the models takes the CPU: one at a time, like generations.
        one_at_a_time = {"concurrency_id": "generation", "concurrency_limit": 1}
        self.ceiling_btn.click(measure_ceiling, [*fields, n_ctx], self.ceiling_note,
                               api_name="ceiling", **one_at_a_time)
        self.download_btn.click(download, fields, self.download_note, api_name="download",
                                concurrency_id="download", concurrency_limit=1)

        def on_load(t_repo: str, t_file: str, d_repo: str, d_file: str, ctx: float,
                    lora_path: str = "", scale: float = 1.0, draft_lora_path: str = "",
                    draft_scale: float = 1.0, gpu_layers: str = GPU_LAYERS,
                    draft_gpu_layers: str = GPU_LAYERS, flash_attn: str = FLASH_ATTN,
                    kv_type: str = KV_TYPE) -> Iterator[str]:
            settings = LoaderSettings(gpu_layers, draft_gpu_layers, CTX, flash_attn, kv_type)
            yield from load_pair(holder, t_repo, t_file, d_repo, d_file, ctx, lora_path, scale,
                                 draft_lora_path, draft_scale, settings)

        load_event = self.load_btn.click(
            on_load, [*fields, n_ctx, self.lora, self.lora_scale, self.draft_lora,
                      self.draft_lora_scale, *self.settings[1:]], self.load_note,
            api_name="load_pair", **one_at_a_time)
        self.catalog_btn.click(catalog_rows, None, self.table, api_name="catalog")
        self.adapt.button.click(
            adapt, [*fields, self.lora, self.lora_scale, self.adapt.prompts, self.adapt.train,
                    self.adapt.epochs], self.adapt.note, api_name="adapt", **one_at_a_time)
        return load_event


def adapt(target_repo: str, target_file: str, draft_repo: str, draft_file: str, lora: str = "",
          lora_scale: float = 1.0, prompts_file: str = "", train_set: str = Settings.train,
          epochs: float = Settings.epochs) -> Iterator[str]:
    """Adapt the chosen draft to the chosen target (with the target's LoRA adapter, if one is
    given): `tandem adapt`'s run, its progress and then its proof."""
    target = ModelChoice(target_repo.strip(), target_file.strip())
    draft = ModelChoice(draft_repo.strip(), draft_file.strip())
    yield from adapt_draft(target.local_path(), draft.local_path(), _adapters(lora, lora_scale),
                           prompts_file, train_set, epochs)


def _on_file(repo_id: str | None, filename: str | None):
    if not repo_id or not filename:
        return gr.update(), gr.update(), gr.update()
    return repo_id, filename, gr.update(choices=suggest_drafts(repo_id), value=None)


def _on_draft(key: str | None):
    if not key or "|" not in key:
        return gr.update(), gr.update()
    d_repo, d_file = key.split("|", 1)
    return d_repo, d_file


def build(holder: PairHolder, start: Start | None = None) -> dict[str, Any]:
    """The tab, its fields filled from `start` (`tandem ui`'s flags; the defaults without)."""
    gr.Markdown("Pick a target, check that the pair fits and is compatible, download it, then load it.")
    steps = Steps(start or Start())
    steps.wire_choices()
    return {"load_event": steps.wire_actions(holder), "pair": steps.pair}

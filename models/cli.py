"""The model subcommands of `tandem`: models list/search/files, pull, compat, budget.

`register(subparsers)` adds them; each sets `func(args) -> int`. TandemErrors propagate to
app/cli.py, which prints `error: <message>` and exits 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from tqdm import tqdm

from engine.errors import HubError, ModelFileError, SettingsError
from models import (budget, catalog, compat, disk_pairs, embedded, found, hub, machine, offload,
                    other_stores, registry)
from models.found import size_text
from models.tandem_store import store_dir

PAIRS_CTX = 4096


def add_models_dir_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--models-dir, shared by every command that finds models by name."""
    p.add_argument("--models-dir", action="append", default=[], metavar="DIR",
                   help="also look for GGUF files in DIR (repeatable; TANDEM_MODEL_DIRS adds more,"
                   " separated by the path separator)")


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def print_found(scan: found.Scan) -> None:
    """The models found on this machine and the pairs among them."""
    print("\non this machine (used where they lie, never copied):")
    if not scan.models:
        print("  (none found)")
    else:
        header = [c.upper() for c in found.COLUMNS]
        lines = _table([header] + [m.cells() for m in scan.models])
        print(lines[0])
        for m, line in zip(scan.models, lines[1:]):
            print(line)
            if m.aliases:
                print(f"    also known as {', '.join(m.aliases)}")
    print(f"  searched: {scan.where_searched()}")
    disk = disk_pairs.pairs(scan.usable, n_ctx=PAIRS_CTX)
    print(f"\npairs on this machine (drafts that compat accepts, best first; memory at n_ctx {PAIRS_CTX}):")
    if not disk:
        print("  (none: no found model has a smaller compatible draft on disk)")
    for pair in disk:
        print(f"  {pair.target.name}  (tandem generate --target {pair.target.name}"
              f" --draft {pair.drafts[0].draft.name})")
        for d in pair.drafts:
            print(f"    {d.label()}")


def cmd_models_list(args: argparse.Namespace) -> int:
    local = {m.path.name: m for m in registry.list_local()}
    print("catalog (target + draft, default quantizations):")
    for p in catalog.load_catalog():
        t_path, d_path = p.local_paths()
        here = "local" if t_path.is_file() and d_path.is_file() else ("offline" if p.offline else "hub")
        size = p.target_file.approx_size + p.draft_file.approx_size
        print(f"  {p.id:26} {p.target.name} {p.target_quant} + {p.draft.name} {p.draft_quant}"
              f"  ~{size_text(size)}  [{here}]")
    print(f"\nlocal store {store_dir()}:")
    if not local:
        print("  (empty)")
    for m in local.values():
        check = "sha256 verified" if m.verified else "sha256 not verified"
        print(f"  {m.path.name:48} {size_text(m.size):>10}  {m.quant:8} {check}")
    print_found(found.scan(args.models_dir))
    return 0


def cmd_models_search(args: argparse.Namespace) -> int:
    for h in hub.search(args.query, limit=args.limit):
        print(f"{h.repo_id:60} downloads {h.downloads or 0}")
    return 0


def cmd_models_files(args: argparse.Namespace) -> int:
    for f in hub.list_gguf_files(args.repo):
        print(f"{f.filename:60} {f.quant:8} {size_text(f.size):>10}")
    return 0


class _Bar:
    """A tqdm bar fed by hub.pull's (done, total) callback."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.bar = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = tqdm(total=total, initial=done, unit="B", unit_scale=True, desc=self.name, file=sys.stderr)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _pull_one(repo: str, filename: str) -> Path:
    bar = _Bar(filename)
    try:
        return hub.pull(repo, filename, progress=bar)
    finally:
        bar.close()


def _pick_file(repo: str, quant: str) -> str:
    files = hub.list_gguf_files(repo)
    matches = [f for f in files if f.quant == quant.upper()]
    if len(matches) != 1:
        have = ", ".join(sorted({f.quant for f in files})) or "none"
        raise HubError(f"{repo} has {len(matches)} GGUF files for {quant.upper()} (quantizations: {have});"
                       f" name one with {repo}:FILE")
    return matches[0].filename


def cmd_pull(args: argparse.Namespace) -> int:
    spec: str = args.spec
    pair = next((p for p in catalog.load_catalog() if p.id == spec), None)
    if pair is not None and pair.offline:
        t, d = embedded.ensure()
        print(f"{pair.id}: target {t}\n{pair.id}: draft  {d}")
        return 0
    if pair is not None:
        t = _pull_one(pair.target.repo, pair.target_file.filename)
        d = _pull_one(pair.draft.repo, pair.draft_file.filename)
        print(f"{pair.id}: target {t} (sha256 verified)\n{pair.id}: draft  {d} (sha256 verified)")
        return 0
    if "/" not in spec:
        raise HubError(f"{spec!r} is neither a catalog pair (`tandem models list`) nor a hub repo id (OWNER/NAME[:FILE])")
    repo, _, filename = spec.partition(":")
    path = _pull_one(repo, filename or _pick_file(repo, args.quant))
    print(f"{path} (sha256 verified)")
    return 0


def cmd_compat(args: argparse.Namespace) -> int:
    report = compat.check_pair(args.target, args.draft)
    print(f"{report.verdict}: {report.summary}")
    for line in report.lines():
        print(f"  {line}")
    return 1 if report.verdict == compat.INCOMPATIBLE else 0


def resolve_model(spec: str, role: str, models_dirs: Sequence[str] = ()) -> Path:
    """A local GGUF for a path, a name from `tandem models list` (Ollama names included), a
    catalog pair id (its target or draft), a catalog model id, or REPO[:FILE] in the store."""
    p = Path(spec).expanduser()
    if p.is_file():
        return p
    on_disk = other_stores.find(spec, models_dirs)
    if on_disk is not None:
        return other_stores.usable_path(on_disk)
    if spec.endswith(".gguf") and ":" not in spec:
        return p
    pair = next((x for x in catalog.load_catalog() if x.id == spec), None)
    if pair is not None:
        path = pair.local_paths()[0 if role == "target" else 1]
        if not path.is_file():
            raise ModelFileError(f"{path.name} is not in the store yet; run `tandem pull {pair.id}`")
        return path
    repo, _, filename = spec.partition(":")
    model = catalog.find_model(repo)
    if not filename and model is not None:
        filename = next(iter(model.files.values())).filename
        repo = model.repo
    if filename and (store_dir() / Path(filename).name).is_file():
        return store_dir() / Path(filename).name
    raise ModelFileError(f"{spec} is not a local file nor in the store; run `tandem pull {repo}:{filename or 'FILE'}` first")


def cmd_budget(args: argparse.Namespace, workers: Sequence[budget.WorkerMemory] = (),
               here: machine.Machine | None = None) -> int:
    """The budget table and the offload plan, for the pair given (positionally or by --target
    and --draft; a catalog pair id names both) or the default, the embedded pair; on `here`
    (the app passes what llama.cpp reports), or on the device asked about with --gpu-memory
    or --unified-memory; with probed RPC `workers` (`tandem budget --rpc`, added by the app),
    the target spread over them."""
    if len(args.models) > 2 or (args.models and (args.target or args.draft)):
        raise SettingsError("give the pair once: TARGET [DRAFT], or --target and --draft")
    target_spec = args.target or (args.models[0] if args.models else None)
    draft_spec = args.draft or (args.models[1] if len(args.models) > 1 else None)
    if target_spec is None:
        target, draft = embedded.ensure()
    else:
        target = resolve_model(target_spec, "target", args.models_dir)
        is_pair = any(p.id == target_spec for p in catalog.load_catalog())
        draft_spec = draft_spec or (target_spec if is_pair else None)
        draft = resolve_model(draft_spec, "draft", args.models_dir) if draft_spec else None
    m = machine.what_if(here or machine.detect(),
                        machine.parse_size(args.gpu_memory) if args.gpu_memory else None,
                        machine.parse_size(args.unified_memory) if args.unified_memory else None)
    if workers:
        report = budget.estimate_rpc(target, draft, workers, n_ctx=args.ctx, kv_type=args.kv_type,
                                     gpu_layers=args.gpu_layers or -1, machine=m)
        print(report.text())
        return 0 if report.ok else 1
    report, plan = offload.plan_pair(target, draft, m, n_ctx=args.ctx, kv_type=args.kv_type,
                                     gpu_layers=args.gpu_layers,
                                     draft_gpu_layers=args.draft_gpu_layers)
    print(report.text())
    print(f"offload: {plan.line()}")
    return 0 if report.ok else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    m = subparsers.add_parser("models", help="the pair catalog, the local store, hub search")
    msub = m.add_subparsers(dest="models_command", required=True)
    ls = msub.add_parser("list", help="catalog pairs, the local store, the GGUF files other tools"
                         " keep on this machine (HF cache, LM Studio, Ollama, llama.cpp) and the pairs among them")
    add_models_dir_arg(ls)
    ls.set_defaults(func=cmd_models_list)
    se = msub.add_parser("search", help="GGUF repositories on the hub matching a query")
    se.add_argument("query")
    se.add_argument("--limit", type=int, default=20)
    se.set_defaults(func=cmd_models_search)
    fi = msub.add_parser("files", help="the GGUF files (quantizations, sizes) in a hub repository")
    fi.add_argument("repo")
    fi.set_defaults(func=cmd_models_files)

    p = subparsers.add_parser("pull", help="download a catalog pair or a hub GGUF into the store")
    p.add_argument("spec", metavar="PAIR|REPO_ID[:FILE]")
    p.add_argument("--quant", default="Q4_K_M", help="quantization to pick when only REPO_ID is given")
    p.set_defaults(func=cmd_pull)

    c = subparsers.add_parser("compat", help="check that a draft can speculate for a target")
    c.add_argument("target")
    c.add_argument("draft")
    c.set_defaults(func=cmd_compat)

    b = subparsers.add_parser("budget", help="memory needed by a pair, and where its layers go, on "
                              "this machine or on a GPU you name")
    b.add_argument("models", nargs="*", metavar="TARGET [DRAFT]",
                   help="the pair (a path, a name, a catalog pair id; default: the embedded pair)")
    b.add_argument("--target", metavar="PATH|NAME|PAIR|REPO[:FILE]")
    b.add_argument("--draft", metavar="PATH|NAME|PAIR|REPO[:FILE]")
    add_models_dir_arg(b)
    b.add_argument("--ctx", type=int, default=4096)
    b.add_argument("--gpu-layers", type=offload.gpu_layers, default=offload.AUTO,
                   metavar="auto|all|N", help=f"target layers on the GPU (default {offload.AUTO})")
    b.add_argument("--draft-gpu-layers", type=offload.gpu_layers, default=offload.AUTO,
                   metavar="auto|all|N", help=f"draft layers on the GPU (default {offload.AUTO})")
    what_if = b.add_mutually_exclusive_group()
    what_if.add_argument("--gpu-memory", metavar="SIZE",
                         help="plan for a discrete GPU of this size instead of this machine's "
                         "(e.g. 8GiB: will the pair fit my 8 GB card?)")
    what_if.add_argument("--unified-memory", metavar="SIZE",
                         help="plan for an Apple Silicon Mac with this much unified memory "
                         "(e.g. 16GiB)")
    b.add_argument("--kv-type", choices=sorted(budget.KV_TYPES), default="f16")
    b.set_defaults(func=cmd_budget)

"""scripts/gpu-check's Python half: random-weight GGUFs shaped like a Qwen2.5 pair, quantized by
llama.cpp, the verify curve to width 64, the check's JSON and the GPU profile derived from it.

Speed does not depend on the weights' values, so a machine without network (and without model
files) measures a real pair's shapes: Qwen2.5-7B (28 blocks, 3584 wide, 18,944 FFN, 28 heads,
4 KV heads) or, with `--target 14b`, Qwen2.5-14B (48 blocks, 5120 wide, 13,824 FFN, 40 heads,
8 KV heads; its config.json) as the target and Qwen2.5-0.5B (24 blocks, 896 wide, tied
embeddings) as its draft, one byte-level BPE tokenizer of 151,936 tokens for all (the 7B's and
14B's own embeddings have 152,064 rows, 128 of them padding: 0.08% of the output matrix). Each is
written as F16, streamed tensor by tensor (a 7B is 15 GB, a 14B 30 GB: never all in memory), then
Q4_K_M-quantized by llama.cpp's own quantizer (engine/llama/quantize.py). `--tiny` writes a pair of
the same family small enough for a CPU test. Values come from one seeded pool of normals, cycled
per tensor.

`curve` times the target's decode of w tokens with every row's logits (what a verify is) at the
sparse widths `CURVE_WIDTHS` (1-9, then 12 to 64: the copies' widths) and the draft's decode of as
many, the median of `--reps` sweeps after one warm-up sweep. `profile` turns a check's JSON into
the GPU profile every GPU figure reads (bench/benchmark/gpu_profile.py): the curve step's widths
when the check has one, else `tandem calibrate`'s widths 1-9.

    python -m scripts.gpu_check write OUT_DIR [--tiny] [--target 7b|14b] [--threads N]
    python -m scripts.gpu_check curve TARGET DRAFT OUT_JSON [--ctx N] [--reps N] [--flash-attn MODE]
    python -m scripts.gpu_check report OUT_JSON STEPS_TSV KEY=FILE...
    python -m scripts.gpu_check profile CHECK_JSON OUT_JSON [--date YYYY-MM-DD] [--target 7b|14b]
"""
from __future__ import annotations

import engine.llama.load_first  # noqa: F401  (before numpy: engine/llama/load_first.py)
# isort: split

import argparse
import datetime
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from engine.llama.quantize import quantize
from engine.llama.quiet import quiet_llama

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
POOL = 1 << 22


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    tied: bool
    n_vocab: int = 151936

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


# Targets by name (`--target`): Qwen2.5-7B's and Qwen2.5-14B's config.json (hidden_size,
# intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads).
TARGETS = {
    "7b": Shape(28, 3584, 18944, 28, 4, tied=False),
    "14b": Shape(48, 5120, 13824, 40, 8, tied=False),
}
DRAFT = Shape(24, 896, 4864, 14, 2, tied=True)
SHAPES = {"target": TARGETS["7b"], "draft": DRAFT}
# The verify curve's widths: every gamma a draft model takes (1-9), then sparse to the longest
# copy (64 drafted tokens: a width of 65 is read past the widest, as the profile extends it).
CURVE_WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24, 32, 48, 64)
# K-quants pack 256 values per block: every row of the tiny pair is a multiple of it.
TINY = {
    "target": Shape(2, 256, 512, 4, 2, tied=False, n_vocab=1024),
    "draft": Shape(1, 256, 512, 4, 2, tied=True, n_vocab=1024),
}


def byte_chars() -> list[str]:
    """GPT-2's byte-level alphabet: one printable character per byte, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tokenizer(n_vocab: int) -> tuple[list[str], list[int], list[str]]:
    """Tokens, their types and merges: every byte, a few merges, filler, then the specials."""
    base = byte_chars()
    merges = ["Ġ t", "Ġ a", "h e", "i n", "r e", "o n"]
    merged = [m.replace(" ", "") for m in merges]
    fill = n_vocab - len(base) - len(merged) - len(SPECIALS)
    tokens = base + merged + [f"<|x{i}|>" for i in range(fill)] + list(SPECIALS)
    types = [int(gguf.TokenType.NORMAL)] * (len(tokens) - len(SPECIALS)) + \
        [int(gguf.TokenType.CONTROL)] * len(SPECIALS)
    return tokens, types, merges


def tensors(s: Shape) -> list[tuple[str, tuple[int, ...], type]]:
    """Every tensor of a Qwen2 model of shape `s`: name, numpy shape (rows, columns), dtype."""
    kv = s.n_head_kv * s.head_dim
    out: list[tuple[str, tuple[int, ...], type]] = [
        ("token_embd.weight", (s.n_vocab, s.n_embd), np.float16),
        ("output_norm.weight", (s.n_embd,), np.float32)]
    if not s.tied:
        out.append(("output.weight", (s.n_vocab, s.n_embd), np.float16))
    for i in range(s.n_layer):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (s.n_embd,), np.float32),
                (b + "attn_q.weight", (s.n_embd, s.n_embd), np.float16),
                (b + "attn_q.bias", (s.n_embd,), np.float32),
                (b + "attn_k.weight", (kv, s.n_embd), np.float16),
                (b + "attn_k.bias", (kv,), np.float32),
                (b + "attn_v.weight", (kv, s.n_embd), np.float16),
                (b + "attn_v.bias", (kv,), np.float32),
                (b + "attn_output.weight", (s.n_embd, s.n_embd), np.float16),
                (b + "ffn_norm.weight", (s.n_embd,), np.float32),
                (b + "ffn_gate.weight", (s.n_ff, s.n_embd), np.float16),
                (b + "ffn_up.weight", (s.n_ff, s.n_embd), np.float16),
                (b + "ffn_down.weight", (s.n_embd, s.n_ff), np.float16)]
    return out


def write_model(path: Path, s: Shape, name: str, seed: int = 0) -> Path:
    """An F16 Qwen2 GGUF of shape `s` with random weights, written one tensor at a time."""
    tokens, types, merges = tokenizer(s.n_vocab)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name(name)
    w.add_block_count(s.n_layer)
    w.add_context_length(32768)
    w.add_embedding_length(s.n_embd)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)
    layout = tensors(s)
    for tname, shape, dtype in layout:
        w.add_tensor_info(tname, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    pool = (np.random.default_rng(seed).standard_normal(POOL) * 0.02).astype(np.float16)
    for i, (tname, shape, dtype) in enumerate(layout):
        if tname.endswith("norm.weight"):
            data = np.ones(shape, dtype=dtype)
        else:
            data = np.resize(np.roll(pool, i * 7919), shape).astype(dtype)
        w.write_tensor_data(data)
    w.close()
    return path


def describe(name: str, s: Shape, role: str) -> str:
    """A model's shape as a profile's label names it."""
    return (f"{name}-shaped Q4_K_M {role} ({s.n_layer} blocks, {s.n_embd} wide, FFN {s.n_ff}, "
            f"{s.n_head}/{s.n_head_kv} heads, random weights)")


def described(target: str, tiny: bool = False) -> dict[str, str]:
    """The pair `write` writes, described: {"target": ..., "draft": ...}."""
    if tiny:
        return {role: describe("tiny", s, role) for role, s in TINY.items()}
    return {"target": describe(f"Qwen2.5-{target.upper()}", TARGETS[target], "target"),
            "draft": describe("Qwen2.5-0.5B", DRAFT, "draft")}


def cmd_write(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = TINY if args.tiny else {"target": TARGETS[args.target], "draft": DRAFT}
    timings: dict = dict(described(args.target, args.tiny))
    for role, shape in shapes.items():
        f16 = out / f"{role}.f16.gguf"
        q4 = out / f"{role}.Q4_K_M.gguf"
        start = time.perf_counter()
        write_model(f16, shape, f"random-qwen2.5-{role}")
        timings[f"write_{role}_s"] = round(time.perf_counter() - start, 1)
        start = time.perf_counter()
        quantize(f16, q4, "q4_k", threads=args.threads, pure=False)
        timings[f"quantize_{role}_s"] = round(time.perf_counter() - start, 1)
        f16.unlink()
        print(f"{q4} ({q4.stat().st_size / (1 << 30):.2f} GiB)", file=sys.stderr)
    print(json.dumps(timings))
    return 0


def timed_widths(backend, widths, reps: int, all_rows: bool) -> list[float]:
    """Median ms of a decode of each width after a prefix, over `reps` sweeps of every width
    (one warm-up sweep first: a width's first decode allocates its graph), rolled back each time."""
    prefix = backend.tokenize("def fibonacci(n):\n    ", add_special=False)
    filler = (prefix * (max(widths) // len(prefix) + 1))[:max(widths)]
    backend.truncate(0)
    backend.decode(prefix, 0, [len(prefix) - 1])
    n0 = len(prefix)
    times: dict[int, list[float]] = {w: [] for w in widths}
    for sweep in range(reps + 1):
        for w in widths:
            start = time.perf_counter()
            backend.decode(filler[:w], n0, list(range(w)) if all_rows else [w - 1])
            if sweep:
                times[w].append((time.perf_counter() - start) * 1e3)
            backend.truncate(n0)
    return [round(statistics.median(times[w]), 3) for w in widths]


def cmd_curve(args: argparse.Namespace) -> int:
    """The verify curve at `CURVE_WIDTHS` (`--widths` for another), and the draft's decodes."""
    from engine.backend import ModelConfig
    from engine.llama.backend import LlamaBackend
    widths = tuple(int(w) for w in args.widths.split(",")) if args.widths else CURVE_WIDTHS
    out: dict = {"widths": list(widths), "reps": args.reps}
    for role, path, all_rows in (("verify_ms", args.target, True), ("draft_ms", args.draft, False)):
        config = ModelConfig(str(path), n_ctx=args.ctx, n_gpu_layers=-1, flash_attn=args.flash_attn)
        with LlamaBackend(config) as backend:
            out[role] = timed_widths(backend, widths, args.reps, all_rows)
        print(f"{role}: " + " ".join(f"{w}:{ms:.2f}" for w, ms in zip(widths, out[role])),
              file=sys.stderr)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


def gpu_name(report: dict) -> tuple[str, str]:
    """A check's device: its short name (H200) and its line (nvidia-smi's or vulkaninfo's)."""
    text = str(report.get("gpu", "")).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) >= 2 and lines[0].startswith("name"):
        fields = [f.strip() for f in lines[1].split(",")]
        full = (f"{fields[0]} (compute {fields[1]}, {fields[2]}, driver {fields[-1]})"
                if len(fields) >= 5 else fields[0])
        return fields[0].removeprefix("NVIDIA ").strip(), full
    for ln in lines:
        if "deviceName" in ln:
            name = ln.split("=", 1)[1].strip()
            return name, name
    raise ValueError("the check's JSON names no GPU (its gpu step wrote nothing)")


def profile_of(report: dict, date: str, target: str | None, source: str) -> dict:
    """The GPU profile (bench/benchmark/gpu_profile.py's file) of one check's JSON: the curve
    step's widths, else `tandem calibrate`'s ceiling (widths 1 to its gamma + 1)."""
    name, device = gpu_name(report)
    curve = report.get("curve")
    if isinstance(curve, dict) and curve.get("verify_ms"):
        widths, verify, draft, where = curve["widths"], curve["verify_ms"], curve["draft_ms"], "curve"
    else:
        calibrated = report.get("calibrate")
        ceiling = calibrated.get("ceiling") if isinstance(calibrated, dict) else None
        if not ceiling:
            raise ValueError("the check's JSON has neither a curve nor a calibration")
        verify, draft = ceiling["verify_ms"], ceiling["draft_ms"]
        widths, where = list(range(1, len(verify) + 1)), "calibrate.ceiling"
    written = report.get("write") if isinstance(report.get("write"), dict) else {}
    pair = described(target) if target else {k: written.get(k) for k in ("target", "draft")}
    if not pair["target"] or not pair["draft"]:
        raise ValueError("the check's JSON does not name its pair's shapes: give --target")
    build = str(report.get("build", "")).strip()
    if not build:
        raise ValueError("the check's JSON does not name its build (its build step wrote nothing)")
    return {"name": name, "device": device, "target": pair["target"], "draft": pair["draft"],
            "build": build, "date": date, "source": f"{source}: {where}", "widths": list(widths),
            "verify_ms": list(verify), "draft_ms": list(draft)}


def cmd_profile(args: argparse.Namespace) -> int:
    report = json.loads(Path(args.check).read_text())
    if args.build:
        report["build"] = args.build
    date = args.date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    data = profile_of(report, date, args.target, Path(args.check).name)
    Path(args.out).write_text(json.dumps(data, indent=2) + "\n")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """One JSON object: each step's seconds (STEPS_TSV: `name<TAB>seconds<TAB>exit status`),
    and each KEY=FILE's contents (parsed when it is JSON, else its text)."""
    steps = []
    for line in Path(args.steps).read_text().splitlines():
        name, seconds, rc = line.split("\t")
        steps.append({"step": name, "seconds": int(seconds), "exit": int(rc)})
    result: dict = {"steps": steps, "total_s": sum(s["seconds"] for s in steps)}
    for item in args.files:
        key, _, file = item.partition("=")
        text = Path(file).read_text() if Path(file).is_file() else ""
        try:
            result[key] = json.loads(text)
        except ValueError:
            result[key] = text.strip()
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_check.py")
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write and quantize the random-weight pair")
    w.add_argument("out")
    w.add_argument("--tiny", action="store_true", help="a pair small enough for a CPU test")
    w.add_argument("--target", choices=sorted(TARGETS), default="7b", help="the target's shape")
    w.add_argument("--threads", type=int, default=None)
    w.set_defaults(func=cmd_write)
    c = sub.add_parser("curve", help="the verify curve and the draft's decodes, to width 64")
    c.add_argument("target")
    c.add_argument("draft")
    c.add_argument("out")
    c.add_argument("--ctx", type=int, default=4096)
    c.add_argument("--reps", type=int, default=5)
    c.add_argument("--widths", default="", help="comma-separated widths (default: CURVE_WIDTHS)")
    c.add_argument("--flash-attn", default="auto", choices=["auto", "on", "off"])
    c.set_defaults(func=cmd_curve)
    g = sub.add_parser("profile", help="the GPU profile of a check's JSON")
    g.add_argument("check")
    g.add_argument("out")
    g.add_argument("--date", default="", help="the run's date (default: today, UTC)")
    g.add_argument("--target", choices=sorted(TARGETS), default=None,
                   help="the target's shape, where the check's JSON does not name it")
    g.add_argument("--build", default="", help="the build, where the check's JSON does not name it")
    g.set_defaults(func=cmd_profile)
    r = sub.add_parser("report", help="the check's JSON")
    r.add_argument("out")
    r.add_argument("steps")
    r.add_argument("files", nargs="*", metavar="KEY=FILE")
    r.set_defaults(func=cmd_report)
    args = p.parse_args(argv)
    quiet_llama()
    try:
        return int(args.func(args))
    except (ValueError, KeyError, OSError) as e:
        print(f"gpu_check {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

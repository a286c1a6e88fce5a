"""scripts/gpu-check's Python half: random-weight GGUFs shaped like a Qwen2.5 pair, quantized by
llama.cpp, and the check's JSON.

Speed does not depend on the weights' values, so a machine without network (and without model
files) measures a real pair's shapes: Qwen2.5-7B (28 blocks, 3584 wide, 18,944 FFN, 28 heads,
4 KV heads) as the target and Qwen2.5-0.5B (24 blocks, 896 wide, tied embeddings) as its draft,
one byte-level BPE tokenizer of 151,936 tokens for both. Each is written as F16, streamed
tensor by tensor (a 7B is 15 GB: never all in memory), then Q4_K_M-quantized by llama.cpp's
own quantizer (engine/llama/quantize.py). `--tiny` writes a pair of the same family
small enough for a CPU test. Values come from one seeded pool of normals, cycled per tensor.

    python -m scripts.gpu_check write OUT_DIR [--tiny] [--threads N]
    python -m scripts.gpu_check report OUT_JSON STEPS_TSV KEY=FILE...
"""
from __future__ import annotations

import engine.llama.load_first  # noqa: F401  (before numpy: engine/llama/load_first.py)
# isort: split

import argparse
import json
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


SHAPES = {
    "target": Shape(28, 3584, 18944, 28, 4, tied=False),
    "draft": Shape(24, 896, 4864, 14, 2, tied=True),
}
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


def cmd_write(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = TINY if args.tiny else SHAPES
    timings = {}
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
    w.add_argument("--threads", type=int, default=None)
    w.set_defaults(func=cmd_write)
    r = sub.add_parser("report", help="the check's JSON")
    r.add_argument("out")
    r.add_argument("steps")
    r.add_argument("files", nargs="*", metavar="KEY=FILE")
    r.set_defaults(func=cmd_report)
    args = p.parse_args(argv)
    quiet_llama()
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

"""The strong case, measured: distilling the embedded draft toward its target with dense labels
(the target's own distribution, DistillSpec's forward KL, arXiv 2310.08461) in PyTorch, which
llama.cpp's trainer cannot do (llama_context::opt_epoch_iter builds one-hot labels from token
ids, so neither soft labels nor a loss mask reach ggml-opt).

The same teacher data and held-out prompts as bench/research/adapt_sweep.py --teach (cached in
derived/ and runs/), the same measure (bench/adapt/proof.py, teacher-forced). The draft's GGUF is
dequantized into a hand-written Qwen2 forward pass (checked against llama.cpp's own greedy
acceptance: the "base" line), the blocks below the trained ones run once (their outputs cached),
and the last blocks, the output norm and optionally the head train against the target's top-K
distribution at each position. The result is written back through the adapted-draft path
(loading/derived/trainable.py) and measured again in llama.cpp, quantized as the draft is.

Not part of the product: PyTorch is not a dependency (`pip install torch` into a venv that
sees the project's, e.g. /root/tv).

  python -m bench.research.adapt_torch --teach assets/prompts/adapt-coding-v2.jsonl
      NAME:LAST:HEAD:LR:EPOCHS:WHERE[:N] ...

LAST is how many of the last blocks train, HEAD `head` or `nohead`, WHERE `answers` (the answer
positions only: a loss mask) or `all` (every position, the prompt's too), N how many of the
trained requests it trains on (default: all, or --trained); the held-out ones are the same.
"""
from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np

try:  # PyTorch is no dependency of Tandem's: this probe runs in a venv that has it
    import torch
    import torch.nn.functional as F
except ImportError:  # imported without it, as tests/test_layers.py imports every module
    torch = F = None  # type: ignore[assignment]

from bench.adapt import data, run
from bench.research.adapt_sweep import _acceptance, _teach, acceptance_of
from engine.backend import ModelConfig
from engine.llama.backend import quiet_backend
from loading.derived.files import derived_dir
from loading.derived.trainable import write_adapted, write_trainable
from models import embedded
from models.gguf_file import GGUFFile
from models.gguf_info import GGUFInfo, read_info
from models.tandem_store import tandem_home

TOP_K = 64


def load_weights(path: Path) -> tuple[dict[str, torch.Tensor], GGUFInfo, GGUFFile]:
    """Every tensor of a GGUF, dequantized to F32, in PyTorch's (out, in) layout; its header."""
    source = GGUFFile(read_info(path))
    out = {}
    for t in source.info.tensors:
        v = gguf.quants.dequantize(np.asarray(source.data(t)),
                                   gguf.GGMLQuantizationType(t.ggml_type))
        out[t.name] = torch.from_numpy(v.astype(np.float32).reshape(tuple(reversed(t.shape))))
    return out, source.info, source


class Qwen2:
    """Qwen2's forward pass over a dict of weights (llama.cpp's names), one sequence at a time.

    x: [n, d] hidden states; rope is NEOX-style (halves rotated), as llama.cpp runs qwen2."""

    def __init__(self, w: dict[str, torch.Tensor], info: GGUFInfo, source: GGUFFile):
        self.w, self.n_layer = w, info.n_layer
        self.n_head, self.n_kv, self.hd = info.n_head, info.n_head_kv, info.head_dim_k
        self.eps = float(source.value("qwen2.attention.layer_norm_rms_epsilon"))
        self.theta = float(source.value("qwen2.rope.freq_base"))
        self.d = info.n_embd

    def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w[name]

    def rope(self, x: torch.Tensor) -> torch.Tensor:  # x: [h, n, hd]
        n, hd = x.shape[1], x.shape[2]
        inv = self.theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = torch.outer(torch.arange(n, dtype=torch.float64), inv)
        cos, sin = ang.cos().float(), ang.sin().float()
        a, b = x[..., :hd // 2], x[..., hd // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    def block(self, x: torch.Tensor, i: int) -> torch.Tensor:
        w, p = self.w, f"blk.{i}."
        n = x.shape[0]
        h = self.norm(x, p + "attn_norm.weight")
        q = (h @ w[p + "attn_q.weight"].T + w[p + "attn_q.bias"]).view(n, self.n_head, self.hd)
        k = (h @ w[p + "attn_k.weight"].T + w[p + "attn_k.bias"]).view(n, self.n_kv, self.hd)
        v = (h @ w[p + "attn_v.weight"].T + w[p + "attn_v.bias"]).view(n, self.n_kv, self.hd)
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        q, k = self.rope(q), self.rope(k)
        rep = self.n_head // self.n_kv
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + a.transpose(0, 1).reshape(n, self.d) @ w[p + "attn_output.weight"].T
        h = self.norm(x, p + "ffn_norm.weight")
        g = F.silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)
        return x + g @ w[p + "ffn_down.weight"].T

    def hidden(self, tokens: list[int], upto: int) -> torch.Tensor:
        x = self.w["token_embd.weight"][torch.tensor(tokens)]
        for i in range(upto):
            x = self.block(x, i)
        return x

    def logits(self, x: torch.Tensor, start: int, rows: slice | None = None) -> torch.Tensor:
        for i in range(start, self.n_layer):
            x = self.block(x, i)
        if rows is not None:
            x = x[rows]
        return self.norm(x, "output_norm.weight") @ self.w["output.weight"].T


def teacher_topk(target: Path, examples: list[data.Example], cache: Path
                 ) -> list[tuple[np.ndarray, np.ndarray]]:
    """The target's top-K token ids and probabilities (T 1, renormalized over the K) at every
    position of each example but the last, cached in runs/."""
    if not cache.is_file():
        ids, ps, lens = [], [], []
        with quiet_backend(ModelConfig(path=str(target), n_ctx=2048, n_threads=2)) as tb:
            for j, e in enumerate(examples):
                tb.truncate(0)
                toks = e.tokens
                rows = tb.decode(toks, 0, list(range(len(toks) - 1)))
                top = np.argpartition(-rows, TOP_K, axis=1)[:, :TOP_K]
                z = np.take_along_axis(rows, top, 1).astype(np.float64)
                z = np.exp(z - z.max(1, keepdims=True))
                ids.append(top.astype(np.int32))
                ps.append((z / z.sum(1, keepdims=True)).astype(np.float32))
                lens.append(len(top))
                print(f"# teacher rows {j + 1}/{len(examples)}", flush=True)
        cache.parent.mkdir(parents=True, exist_ok=True)
        data.save_arrays(cache, ids=np.concatenate(ids), ps=np.concatenate(ps),
                         lens=np.array(lens))
    with np.load(cache) as f:
        cut = np.cumsum(f["lens"])[:-1]
        return list(zip(np.split(f["ids"], cut), np.split(f["ps"], cut)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teach", required=True)
    ap.add_argument("--trained", type=int)
    ap.add_argument("--no-llama", action="store_true", help="measure in PyTorch only")
    ap.add_argument("settings", nargs="+", help="NAME:LAST:HEAD:LR:EPOCHS:WHERE[:N]")
    args = ap.parse_args(argv)
    if torch is None:
        ap.error("PyTorch is not installed here: pip install torch into a venv that sees this one")
    torch.set_num_threads(2)
    torch.manual_seed(0)
    target, draft = embedded.ensure()
    examples, n_prompts, suite = _teach(args.teach, target, data.ANSWER_TOKENS, True)
    stem = f"adapt-data-{data.data_sha256(examples)[:16]}"
    trained, yours = run.split(examples, n_prompts)
    held = yours + suite
    sweep = np.load(tandem_home() / "runs" / f"adapt-sweep-{stem}.npz")
    target_rows = [sweep[f"r{i}"] for i in range(len(held))]
    teacher = teacher_topk(target, trained, tandem_home() / "runs" / f"adapt-topk-{stem}.npz")
    trained, teacher = trained[:args.trained], teacher[:args.trained]
    w, info, source = load_weights(draft)
    m = Qwen2(w, info, source)

    def measure(label: str, extra: dict) -> None:
        def draft_rows(e: data.Example) -> np.ndarray:
            with torch.no_grad():
                return m.logits(hid[id(e)], start,
                                slice(len(e.prompt) - 1, len(e.tokens) - 1)).numpy()
        got = acceptance_of(draft_rows, trained[:used], held, target_rows,
                            in_sample=f"in sample ({used})")
        if label == "base":
            base.update(got)
        # A gain over base where base measured the same requests; else the value itself.
        print(json.dumps({"setting": label, **extra, **{
            k: round(v - base[k], 3) if label != "base" and k in base else round(v, 3)
            for k, v in got.items()}}), flush=True)

    base: dict[str, float] = {}
    llama_base: dict[str, float] = {}
    start, hid = -1, {}
    for spec in args.settings:
        name, last, head, lr, epochs, where, *n_used = spec.split(":")
        used = int(n_used[0]) if n_used else len(trained)
        if m.n_layer - int(last) != start:
            start = m.n_layer - int(last)
            with torch.no_grad():
                hid = {id(e): m.hidden(e.tokens, start) for e in trained + held}
        if not base:
            measure("base", {})
        names = [n for n in w if n.startswith(tuple(f"blk.{i}." for i in range(start, m.n_layer)))
                 or n.startswith("output_norm.") or (head == "head" and n == "output.weight")]
        saved = {n: w[n].clone() for n in names}
        params = [w[n].requires_grad_() for n in names]
        opt = torch.optim.AdamW(params, lr=float(lr), weight_decay=0.0)
        steps = int(epochs) * used
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / 10) * 0.5 * (1 + math.cos(math.pi * s / steps)))
        order = np.random.default_rng(0)
        seconds, losses = 0.0, []
        for ep in range(int(epochs)):
            total = 0.0
            for j in order.permutation(used):
                e, (ids, ps) = trained[j], teacher[j]
                t0 = time.monotonic()
                lo = 0 if where == "all" else len(e.prompt) - 1
                x = m.logits(hid[id(e)], start, slice(lo, len(e.tokens) - 1))
                logq = F.log_softmax(x, dim=-1)
                loss = -(torch.from_numpy(ps[lo:]) * logq.gather(1, torch.from_numpy(
                    ids[lo:]).long())).sum(1).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                seconds += time.monotonic() - t0
                total += float(loss.detach())
            losses.append(round(total / used, 3))
        for p in params:
            p.requires_grad_(False)
        info = {"last": int(last), "head": head, "lr": float(lr), "epochs": int(epochs),
                "where": where, "examples": used, "train_s": round(seconds),
                "loss": losses}
        measure(name + " (torch f32)", info)
        if not args.no_llama:
            with tempfile.TemporaryDirectory(dir=derived_dir(), prefix=".torch-") as work:
                tpath, apath = Path(work) / "t.gguf", Path(work) / "a.gguf"
                write_trainable(draft, tpath, lambda n: n in names)
                r = gguf.GGUFReader(str(tpath), "r+")
                for t in r.tensors:
                    if t.name in names:
                        t.data[...] = w[t.name].detach().numpy().reshape(t.data.shape)
                r.data.flush()
                del r
                write_adapted(draft, tpath, apath, names)
                if not llama_base:
                    llama_base.update(_acceptance(draft, trained, held, target_rows))
                    print(json.dumps({"setting": "base (llama.cpp)", **{
                        k: round(v, 3) for k, v in llama_base.items()}}), flush=True)
                got = _acceptance(apath, trained, held, target_rows)
                print(json.dumps({"setting": name + " (llama.cpp, requantized)", **{
                    k: round(v - llama_base[k], 3) for k, v in got.items()}}), flush=True)
        for n in names:
            w[n] = saved[n]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

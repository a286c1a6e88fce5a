"""Write tiny but well-formed GGUF files (a few KB) with a chosen tokenizer, for fast tests."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def vocab(n: int = 300) -> list[str]:
    """A byte-BPE-looking vocabulary: control tokens first, then distinct text pieces."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    return specials + [f"tok{i}" for i in range(n - len(specials))]


def write(path: Path, *, tokens: list[str] | None = None, arch: str = "llama", tokenizer_model: str = "gpt2",
          pre: str = "qwen2", bos: int | None = 0, eos: int | None = 2, eot: int | None = None,
          add_bos: bool | None = False, add_eos: bool | None = None,
          template: str | None = TEMPLATE, n_layer: int = 2, n_embd: int = 16, n_head: int = 4,
          n_head_kv: int = 2, n_ctx_train: int = 4096, file_type: int = gguf.LlamaFileType.ALL_F32,
          pad_bytes: int = 0, token_embd: np.ndarray | None = None,
          output: np.ndarray | None = None,
          embd_type: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32) -> Path:
    """Write a GGUF with the given tokenizer metadata and one f32 tensor per layer plus embeddings.

    `pad_bytes` adds a zero tensor of about that size, for tests that need a file of many MB.
    `token_embd` ([n_vocab, n_embd]) and `output` give those tensors values, stored as
    `embd_type`. A special-token id or add flag given as None is left out of the header, so the
    reader falls back to the tokenizer type's default.
    """
    tokens = vocab() if tokens is None else tokens
    path = Path(path)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(path.stem)
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_embd * 4)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(int(file_type))
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    types = [gguf.TokenType.CONTROL if t.startswith("<|") else gguf.TokenType.NORMAL for t in tokens]
    w.add_token_types([int(t) for t in types])
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if eot is not None:
        w.add_eot_token_id(eot)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if add_eos is not None:
        w.add_add_eos_token(add_eos)
    if template is not None:
        w.add_chat_template(template)
    for name, rows in (("token_embd.weight", token_embd), ("output.weight", output)):
        if rows is None and name == "output.weight":
            continue
        rows = np.zeros((len(tokens), n_embd), dtype=np.float32) if rows is None else rows
        if embd_type == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, rows.astype(np.float32))
        else:
            w.add_tensor(name, gguf.quants.quantize(rows.astype(np.float32), embd_type),
                         raw_dtype=embd_type)
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((n_embd, n_embd), dtype=np.float32))
    if pad_bytes:
        w.add_tensor("pad.weight", np.zeros(pad_bytes // 4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

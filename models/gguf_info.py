"""What a GGUF file's header says: architecture, shapes, tokenizer, chat template, tensor sizes.

The header is parsed with a single pass over the metadata and tensor-info sections; tensor data
is never read. gguf.GGUFReader would also work but builds a numpy view per vocabulary entry,
which takes seconds on a 150k-token vocabulary; the type tables still come from the gguf package.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf

from engine.errors import ModelFileError

# struct formats of GGUF's scalar value types (also used to write them, loading/derived/gguf_copy.py).
SCALARS: dict[int, str] = {
    gguf.GGUFValueType.UINT8: "<B", gguf.GGUFValueType.INT8: "<b",
    gguf.GGUFValueType.UINT16: "<H", gguf.GGUFValueType.INT16: "<h",
    gguf.GGUFValueType.UINT32: "<I", gguf.GGUFValueType.INT32: "<i",
    gguf.GGUFValueType.FLOAT32: "<f", gguf.GGUFValueType.BOOL: "<?",
    gguf.GGUFValueType.UINT64: "<Q", gguf.GGUFValueType.INT64: "<q",
    gguf.GGUFValueType.FLOAT64: "<d",
}
# Arrays we only need to skip or hash; decoding 150k merges into Python strings is wasted work.
_SKIP_ARRAYS = frozenset({"tokenizer.ggml.merges", "tokenizer.ggml.scores"})


@dataclass(frozen=True)
class TensorInfo:
    name: str
    # As stored: ggml's order, the row length first.
    shape: tuple[int, ...]
    type_name: str
    n_bytes: int
    # ggml's type number, and where the data starts in the file (an absolute offset).
    ggml_type: int = 0
    offset: int = 0


@dataclass(frozen=True)
class FieldSpan:
    """Where one metadata entry (key, type and value) lies in the header, for a copy that keeps
    it byte for byte (loading/derived/gguf_copy.py)."""
    vtype: int
    start: int
    end: int


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    file_size: int
    architecture: str
    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ctx_train: int
    n_vocab: int
    tokenizer_model: str
    tokenizer_pre: str
    tokens_sha256: str
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    add_bos: bool | None
    add_eos: bool | None
    chat_template: str | None = field(repr=False)
    file_type: str
    tensor_bytes: int
    sliding_window: int | None = None
    tokens: tuple[str, ...] = field(default=(), repr=False, compare=False)
    token_types: tuple[int, ...] = field(default=(), repr=False, compare=False)
    tensors: tuple[TensorInfo, ...] = field(default=(), repr=False, compare=False)
    metadata: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # Every metadata entry's place in the header, in file order, and the tensor data's alignment.
    fields: dict[str, FieldSpan] = field(default_factory=dict, repr=False, compare=False)
    alignment: int = gguf.GGUF_DEFAULT_ALIGNMENT

    @property
    def control_tokens(self) -> frozenset[int]:
        """Ids marked CONTROL in the vocabulary: the special tokens a chat template relies on."""
        control = int(gguf.TokenType.CONTROL)
        return frozenset(i for i, t in enumerate(self.token_types) if t == control)


class _Cursor:
    def __init__(self, data: bytes, path: Path, skip: frozenset[str] = _SKIP_ARRAYS) -> None:
        self.data = data
        self.pos = 0
        self.path = path
        self.skip = skip

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise _Truncated
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def raw_string(self) -> bytes:
        n = self.take("<Q")
        if self.pos + n > len(self.data):
            raise _Truncated
        s = self.data[self.pos:self.pos + n]
        self.pos += n
        return s

    def string(self) -> str:
        return self.raw_string().decode("utf-8", errors="replace")

    def value(self, vtype: int, key: str) -> Any:
        if vtype == gguf.GGUFValueType.STRING:
            return self.string()
        if vtype in SCALARS:
            return self.take(SCALARS[vtype])
        if vtype == gguf.GGUFValueType.ARRAY:
            itype = self.take("<I")
            n = self.take("<Q")
            if key in self.skip:
                self._skip_array(itype, n)
                return n
            if itype == gguf.GGUFValueType.STRING:
                return [self.string() for _ in range(n)]
            if itype in SCALARS:
                fmt = SCALARS[itype]
                size = struct.calcsize(fmt)
                if self.pos + size * n > len(self.data):
                    raise _Truncated
                out = list(struct.unpack_from("<" + fmt[1] * n, self.data, self.pos))
                self.pos += size * n
                return out
            return [self.value(itype, key) for _ in range(n)]
        raise ModelFileError(f"{self.path} has an unknown GGUF value type {vtype} for key {key}")

    def _skip_array(self, itype: int, n: int) -> None:
        if itype == gguf.GGUFValueType.STRING:
            for _ in range(n):
                self.pos += 8 + self.take("<Q")
            if self.pos > len(self.data):
                raise _Truncated
        elif itype in SCALARS:
            self.pos += struct.calcsize(SCALARS[itype]) * n
        else:
            for _ in range(n):
                self.value(itype, "")


class _Truncated(Exception):
    pass


def entry_value(entry: bytes, path: Path) -> Any:
    """The whole value of one metadata entry's bytes (`FieldSpan`), arrays included."""
    cur = _Cursor(entry, path, skip=frozenset())
    key = cur.string()
    try:
        return cur.value(cur.take("<I"), key)
    except _Truncated:
        raise ModelFileError(f"{path} changed since its header was read (entry {key})") from None


Raw = list[tuple[str, tuple[int, ...], int, int]]


def _parse(path: Path, data: bytes) -> tuple[dict[str, Any], dict[str, FieldSpan], Raw, int]:
    cur = _Cursor(data, path)
    magic = cur.take("<I")
    if magic != gguf.GGUF_MAGIC:
        raise ModelFileError(f"{path} is not a GGUF file (bad magic {data[:4]!r})")
    version = cur.take("<I")
    if version not in (2, 3):
        raise ModelFileError(f"{path} uses GGUF version {version}; only versions 2 and 3 are supported")
    n_tensors = cur.take("<Q")
    n_kv = cur.take("<Q")
    meta: dict[str, Any] = {}
    spans: dict[str, FieldSpan] = {}
    for _ in range(n_kv):
        start = cur.pos
        key = cur.string()
        vtype = cur.take("<I")
        meta[key] = cur.value(vtype, key)
        spans[key] = FieldSpan(vtype, start, cur.pos)
    tensors = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.take("<I")
        shape = tuple(cur.take("<Q") for _ in range(n_dims))
        ttype = cur.take("<I")
        offset = cur.take("<Q")
        tensors.append((name, shape, ttype, offset))
    align = int(meta.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT))
    data_start = (cur.pos + align - 1) // align * align
    return meta, spans, tensors, data_start


def _header(path: Path) -> tuple[dict[str, Any], dict[str, FieldSpan], Raw, int, int]:
    """The one parse of a file's header (read_info's); tests count its calls."""
    size = path.stat().st_size
    # Headers of real models are a few MB (the vocabulary); grow the window until parsing succeeds.
    window = 16 << 20
    with open(path, "rb") as f:
        while True:
            f.seek(0)
            data = f.read(window)
            try:
                meta, spans, tensors, data_start = _parse(path, data)
                return meta, spans, tensors, data_start, size
            except _Truncated:
                if window >= size:
                    raise ModelFileError(f"{path} is truncated: its header ends past the end of the file") from None
                window *= 4


def _tensor_bytes(shape: tuple[int, ...], ttype: int, path: Path, name: str) -> tuple[str, int]:
    """The tensor's type name and its size in bytes."""
    try:
        qtype = gguf.GGMLQuantizationType(ttype)
    except ValueError:
        raise ModelFileError(f"{path} has tensor {name} of unknown type {ttype}") from None
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n = 1
    for d in shape:
        n *= d
    return qtype.name, n // block * type_size


def _file_type_name(value: Any) -> str:
    if value is None:
        return "unknown"
    try:
        return gguf.LlamaFileType(int(value)).name.removeprefix("MOSTLY_")
    except ValueError:
        return f"type {value}"


def read_info(path: str | Path) -> GGUFInfo:
    """Read a GGUF header; raise ModelFileError when the file is missing, not GGUF, or truncated."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ModelFileError(f"model file not found: {p}")
    meta, spans, raw_tensors, data_start, size = _header(p)
    arch = str(meta.get("general.architecture", ""))
    if not arch:
        raise ModelFileError(f"{p} is not a model GGUF (no general.architecture key)")

    def a(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    tensors = []
    end = data_start
    for name, shape, ttype, offset in raw_tensors:
        type_name, n_bytes = _tensor_bytes(shape, ttype, p, name)
        tensors.append(TensorInfo(name, shape, type_name, n_bytes, ttype, data_start + offset))
        end = max(end, data_start + offset + n_bytes)
    if end > size:
        raise ModelFileError(f"{p} is truncated: tensor data needs {end} bytes, the file has {size}")

    n_embd = int(a("embedding_length", 0))
    n_head = _first(a("attention.head_count", 0))
    n_head_kv = _first(a("attention.head_count_kv", n_head))
    head_dim = n_embd // n_head if n_head else 0
    tokens = meta.get("tokenizer.ggml.tokens") or []
    digest = hashlib.sha256("\0".join(tokens).encode("utf-8", errors="surrogatepass")).hexdigest()
    return GGUFInfo(
        path=p,
        file_size=size,
        architecture=arch,
        name=str(meta.get("general.name", p.stem)),
        n_layer=int(a("block_count", 0)),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=int(a("attention.key_length", head_dim)),
        head_dim_v=int(a("attention.value_length", head_dim)),
        n_ctx_train=int(a("context_length", 0)),
        n_vocab=len(tokens) or int(a("vocab_size", 0)),
        tokenizer_model=str(meta.get("tokenizer.ggml.model", "")),
        tokenizer_pre=str(meta.get("tokenizer.ggml.pre", "default")),
        tokens_sha256=digest,
        bos_id=_opt_int(meta.get("tokenizer.ggml.bos_token_id")),
        eos_id=_opt_int(meta.get("tokenizer.ggml.eos_token_id")),
        eot_id=_opt_int(meta.get("tokenizer.ggml.eot_token_id")),
        add_bos=_opt_bool(meta.get("tokenizer.ggml.add_bos_token")),
        add_eos=_opt_bool(meta.get("tokenizer.ggml.add_eos_token")),
        chat_template=meta.get("tokenizer.chat_template"),
        file_type=_file_type_name(meta.get("general.file_type")),
        tensor_bytes=sum(t.n_bytes for t in tensors),
        sliding_window=_opt_int(a("attention.sliding_window")),
        tokens=tuple(tokens),
        token_types=tuple(meta.get("tokenizer.ggml.token_type") or ()),
        tensors=tuple(tensors),
        metadata={k: v for k, v in meta.items() if not isinstance(v, list)},
        fields=spans,
        alignment=int(meta.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)),
    )


def _first(v: Any) -> int:
    # Some architectures store per-layer head counts as an array.
    if isinstance(v, list):
        return int(max(v)) if v else 0
    return int(v)


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _opt_bool(v: Any) -> bool | None:
    return None if v is None else bool(v)

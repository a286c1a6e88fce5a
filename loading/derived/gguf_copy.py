"""Writing a GGUF as an edited copy of another (the early-exit and vocabulary-trimmed drafts,
layer-trimmed adapters), read through Tandem's own header description (models/gguf_file.py):
metadata entries kept byte for byte, changed, dropped or added, and tensors kept, dropped or
replaced by their stored bytes. Nothing is decoded that the copy does not change."""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import gguf
import numpy as np

from models.gguf_file import GGUFFile
from models.gguf_info import SCALARS, TensorInfo

# A value in `changed`: leave this key out of the copy.
DROP = object()

# (key, value, type, item type of an array)
Added = tuple[str, Any, gguf.GGUFValueType, "gguf.GGUFValueType | None"]
# (source tensor, its shape in the copy, its stored bytes in the copy)
Tensor = tuple[TensorInfo, tuple[int, ...], np.ndarray]


def kept(t: TensorInfo, source: GGUFFile) -> Tensor:
    """A tensor copied as it is."""
    return t, t.shape, source.data(t)


def _string(s: str) -> bytes:
    b = s.encode("utf-8", errors="surrogatepass")
    return struct.pack("<Q", len(b)) + b


def _value(vtype: int, value: Any, itype: int | None = None) -> bytes:
    if vtype == gguf.GGUFValueType.STRING:
        return _string(str(value))
    if vtype == gguf.GGUFValueType.ARRAY:
        assert itype is not None
        items = list(value)
        head = struct.pack("<IQ", itype, len(items))
        if itype in SCALARS:
            return head + struct.pack("<" + SCALARS[itype][1] * len(items), *items)
        return head + b"".join(_value(itype, v) for v in items)
    return struct.pack(SCALARS[vtype], value)


def _entry(key: str, vtype: int, value: Any, itype: int | None = None) -> bytes:
    return _string(key) + struct.pack("<I", vtype) + _value(vtype, value, itype)


def _pad(n: int, align: int) -> int:
    return (-n) % align


def write_copy(source: GGUFFile, out: Path, changed: Mapping[str, Any], added: Sequence[Added],
               tensors: Iterable[Tensor]) -> None:
    """Write `source`'s file to `out` with the values in `changed` (DROP leaves the key out; a
    changed value keeps the source's type), the `added` entries after the others, and `tensors`
    in the given order."""
    info = source.info
    entries = []
    for key, span in info.fields.items():
        if key not in changed:
            entries.append(source.entry(key))
        elif changed[key] is not DROP:
            itype = source.array_type(key) if span.vtype == gguf.GGUFValueType.ARRAY else None
            entries.append(_entry(key, span.vtype, changed[key], itype))
    entries += [_entry(key, int(vtype), value, None if sub is None else int(sub))
                for key, value, vtype, sub in added]
    tensors = list(tensors)
    align = info.alignment
    infos, offset = [], 0
    for t, shape, data in tensors:
        infos.append(_string(t.name) + struct.pack("<I", len(shape))
                     + struct.pack(f"<{len(shape)}Q", *shape) + struct.pack("<IQ", t.ggml_type, offset))
        offset += data.nbytes + _pad(data.nbytes, align)
    with open(out, "wb") as f:
        f.write(struct.pack("<IIQQ", gguf.GGUF_MAGIC, 3, len(tensors), len(entries)))
        for chunk in (*entries, *infos):
            f.write(chunk)
        f.write(b"\0" * _pad(f.tell(), align))
        for _, _, data in tensors:
            f.write(np.ascontiguousarray(data).data)
            f.write(b"\0" * _pad(data.nbytes, align))

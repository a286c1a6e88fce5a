"""A GGUF file's contents read through its header description (models/gguf_info.py), without
parsing the header again: a metadata entry's bytes or whole value (the arrays the description
leaves out included) and a tensor's stored bytes, from the memory-mapped file."""
from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from models.gguf_info import GGUFInfo, TensorInfo, entry_value

U8 = np.ndarray


class GGUFFile:
    """One GGUF file, mapped read-only, addressed by its header description `info`."""

    def __init__(self, info: GGUFInfo) -> None:
        self.info = info
        self._map = np.memmap(info.path, dtype=np.uint8, mode="r")

    def entry(self, key: str) -> bytes:
        """The metadata entry `key` as stored: its key, type and value."""
        span = self.info.fields[key]
        return self._map[span.start:span.end].tobytes()

    def value(self, key: str, default: Any = None) -> Any:
        """The whole value of metadata `key` (`default` when the file has none)."""
        if key not in self.info.fields:
            return default
        return entry_value(self.entry(key), self.info.path)

    def array_type(self, key: str) -> int:
        """The item type of the array entry `key`."""
        entry = self.entry(key)
        (n,) = struct.unpack_from("<Q", entry, 0)
        (itype,) = struct.unpack_from("<I", entry, 8 + n + 4)
        return itype

    def tensor(self, name: str) -> TensorInfo | None:
        return next((t for t in self.info.tensors if t.name == name), None)

    def data(self, t: TensorInfo) -> U8:
        """The tensor's stored bytes (quantized blocks as they are), a view of the mapped file."""
        return self._map[t.offset:t.offset + t.n_bytes]

    def rows(self, t: TensorInfo) -> U8:
        """The tensor's bytes as one row per entry of its outer dimensions (a matrix of
        [n_vocab, n_embd] stores n_vocab rows); quantized rows keep their blocks whole."""
        n_rows = math.prod(t.shape[1:])
        return self.data(t).reshape(n_rows, t.n_bytes // n_rows)

"""Writing a GGUF as an edited copy of another (the early-exit and vocabulary-trimmed drafts):
metadata keys kept, changed, dropped or added, and tensors kept, dropped or replaced."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import gguf
import numpy as np

from engine.errors import ModelFileError

# Returned by an `edit` function: leave this key out of the copy.
DROP = object()

Added = tuple[str, Any, gguf.GGUFValueType, "gguf.GGUFValueType | None"]


def open_gguf(path: str | Path) -> gguf.GGUFReader:
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, OSError) as exc:
        raise ModelFileError(f"cannot read {Path(path).name} as GGUF: {exc}") from None


def write_copy(reader: gguf.GGUFReader, out: Path, edit: Callable[[str, Any], Any],
               added: Sequence[Added],
               tensors: Iterable[tuple[gguf.ReaderTensor, np.ndarray]]) -> None:
    """Write `reader`'s file to `out` with each key's value passed through `edit(name, value)`
    (DROP leaves it out), the `added` keys after them, and `tensors` as (source tensor, data):
    the source's name and type, the given data."""
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    writer = gguf.GGUFWriter(str(out), arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = edit(field.name, field.contents())
        if value is not DROP:
            writer.add_key_value(field.name, value, vtype, sub_type=sub)
    for key, value, vtype, sub in added:
        writer.add_key_value(key, value, vtype, sub_type=sub)
    tensors = list(tensors)
    for t, data in tensors:
        writer.add_tensor_info(t.name, data.shape, data.dtype, data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data in tensors:
        writer.write_tensor_data(data, tensor_endianess=reader.endianess)
    writer.close()

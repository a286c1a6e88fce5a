"""The header a derived draft will have, for the plan, which derives nothing: the store's
current build where there is one, else the source's header with the bytes the derivation will
write: a requantization's by its block sizes (loading/derived/quantized.py `planned_info`); a
trimmed vocabulary, whose rows are chosen only when it is built, at the full one's (an upper
bound).
"""
from __future__ import annotations

from loading.derived.files import current_build
from loading.derived.quantized import planned_info
from loading.derived.vocab_trim import DEFAULT_RANK_KEEP, tag as trim_tag
from models.gguf_info import GGUFInfo, read_info


def planned_draft(source: GGUFInfo, quant: str | None, trim: bool) -> GGUFInfo:
    """The header of the draft as it will load: `source` requantized to `quant` (None: as
    given), then with a trimmed vocabulary when `trim`."""
    info = source
    if quant is not None:
        built = current_build(source.path, quant)
        if built is None:
            # Not built yet, nor then is its trimmed copy: the estimate, full vocabulary.
            return planned_info(source, quant)
        info = read_info(built)
    if trim:
        built = current_build(info.path, trim_tag(DEFAULT_RANK_KEEP))
        if built is not None:
            info = read_info(built)
    return info

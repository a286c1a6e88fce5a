"""Typed readers of the JSON fields only the API has (n, stream, stream_options): each returns
the value or its default (JSON null counts as absent), or raises a 400 naming the field and
saying what it must be. The request settings are checked by app/runtime/ranges.py's table."""
from __future__ import annotations

from typing import Sequence

from app.serve.errors import BadRequestError


def refuse_unknown(obj: dict, allowed: Sequence[str], prefix: str = "") -> None:
    for key in obj:
        if key not in allowed:
            raise BadRequestError(f"unsupported field {prefix}{key!r}; this server takes "
                                  f"{', '.join(allowed)}", param=f"{prefix}{key}",
                                  code="unsupported_field")


def boolean(obj: dict, key: str, default: bool, name: str | None = None) -> bool:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequestError(f"{name or key} must be true or false, got {value!r}",
                              param=name or key)
    return value


def integer(obj: dict, key: str, default: int | None, low: int | None = None,
            high: int | None = None, name: str | None = None) -> int | None:
    name = name or key
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequestError(f"{name} must be an integer, got {value!r}", param=name)
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"between {low} and {high}" if high is not None else f">= {low}"
        raise BadRequestError(f"{name} must be {span}, got {value}", param=name)
    return value

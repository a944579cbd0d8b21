# The enqueue boundary's check of a payload: JSON or a clear error naming the offending field.
# Apart because nothing may be written when it fails, so it runs before any driver call.
from __future__ import annotations

import json
import math

from .errors import PayloadNotSerialisable

_FIX = (
    "pass only JSON values (dict with str keys, list, str, int, float, bool, None): send a "
    "storage key or id instead of an object, str() a date or UUID, base64-encode bytes"
)


def _first_offender(value: object, path: str) -> tuple[str, str] | None:
    if value is None or isinstance(value, bool | int | str):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, f"{value} is not a finite number")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return (path, f"key {key!r} is a {type(key).__name__}, not a str")
            found = _first_offender(item, f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _first_offender(item, f"{path}[{index}]")
            if found:
                return found
        return None
    return (path, f"a {type(value).__name__} is not JSON-serialisable")


def dump_json(value: object, *, job: str, what: str = "payload") -> str:
    """``value`` as compact JSON text, or ``PayloadNotSerialisable`` naming the field."""
    found = _first_offender(value, what)
    if found is not None:
        field, cause = found
        raise PayloadNotSerialisable(job=job, field=field, cause=cause, fix=_FIX)
    return json.dumps(value, separators=(",", ":"), allow_nan=False)

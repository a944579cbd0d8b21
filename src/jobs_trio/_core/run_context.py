# A run's context: what an enqueue stores with its job (the application's tenant, request id...,
# and the W3C trace context), and how the worker restores it around the body. Apart because both
# ends of that hop, and the one stored form between them, are decided here.
from __future__ import annotations

import contextlib
import json
import types
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from .boundary import check_context
from .tracing import TRACE_KEYS, current_trace

# The application's hooks (Registry(capture_context=, restore_context=)): capture reads the
# calling request's context at enqueue; restore returns a context manager that sets the
# application's context variables from it around the body.
CaptureContext = Callable[[], Mapping[str, str] | None]
RestoreContext = Callable[[Mapping[str, str]], AbstractContextManager[Any]]

_EMPTY: Mapping[str, str] = types.MappingProxyType({})


def stored_context(context: Mapping[str, str] | None, capture: CaptureContext | None) -> str | None:
    """The context an enqueue stores, as JSON text (None: nothing to store): ``context`` when
    given, else the capture hook's answer; checked at the boundary; with the trace context of
    the span current now added under its W3C names."""
    if context is None and capture is not None:
        context = capture()
    checked = check_context(context, reserved=TRACE_KEYS) or {}
    checked.update(current_trace())
    # Sorted: one context is one text, whichever order the application built its dict in.
    return json.dumps(checked, sort_keys=True, separators=(",", ":")) if checked else None


def _stored(text: str | None) -> dict[str, str]:
    return {} if text is None else dict(json.loads(text))


def app_context(text: str | None) -> Mapping[str, str]:
    """The application's part of a stored context, read-only (``ctx.context``)."""
    if text is None:
        return _EMPTY
    stored = _stored(text)
    return types.MappingProxyType({k: v for k, v in stored.items() if k not in TRACE_KEYS})


def trace_of(text: str | None) -> dict[str, str]:
    """The W3C trace context part of a stored context ({} when the enqueue had no span)."""
    return {k: v for k, v in _stored(text).items() if k in TRACE_KEYS}


# Reusable: a null context holds nothing of a run.
_NOTHING_TO_RESTORE: AbstractContextManager[Any] = contextlib.nullcontext()


def restored(
    restore: RestoreContext | None, context: Callable[[], Mapping[str, str]]
) -> AbstractContextManager[Any]:
    """The application's restore hook around a body, called with every run's context (empty
    when its enqueue carried none, so the hook can reset its variables to their defaults).
    Without a hook, a plain null context and no read of the context: this runs once per
    attempt, and a generator's context manager was a measurable part of a no-op job (issue 16)."""
    if restore is None:
        return _NOTHING_TO_RESTORE
    return restore(context())

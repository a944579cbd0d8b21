# OpenTelemetry, when it is installed: the W3C trace context an enqueue stores with its job, and
# one span per attempt whose parent is the span that enqueued it. Apart because it is the one
# module that imports opentelemetry; without it installed nothing is imported and nothing runs.
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .records import Claim

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the `otel` extra is not installed: every function here does nothing
    otel_trace = None  # type: ignore[assignment]

# The names W3C Trace Context gives its fields; an application's context may not use them
# (boundary.check_context), so the trace and the application's context share one stored object.
TRACE_KEYS = frozenset({"traceparent", "tracestate"})

if otel_trace is not None:
    # W3C always, whatever propagators the application configured for its own requests: this
    # hop is jobs_trio's own (enqueue to attempt), and both ends are this module.
    _PROPAGATOR = TraceContextTextMapPropagator()
    # A proxy until the application sets its tracer provider, then that provider's tracer.
    _TRACER = otel_trace.get_tracer("jobs_trio")
    _NO_PROVIDER = (otel_trace.ProxyTracerProvider, otel_trace.NoOpTracerProvider)


def current_trace() -> dict[str, str]:
    """The W3C trace context of the span current in the caller ({} without OpenTelemetry, or
    with no span recording): what an enqueue stores so its attempts' spans hang under it."""
    if otel_trace is None:
        return {}
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return {k: v for k, v in carrier.items() if k in TRACE_KEYS}


class AttemptSpan:
    """What the worker tells an attempt's span once the verdict is in (a no-op without
    OpenTelemetry)."""

    def __init__(self, span: Any = None) -> None:
        self._span = span

    def ended(self, outcome: str, cancel_reason: str | None, error: str | None) -> None:
        span = self._span
        if span is None or not span.is_recording():
            return
        span.set_attribute("jobs_trio.outcome", str(outcome))
        if cancel_reason is not None:
            span.set_attribute("jobs_trio.cancel_reason", str(cancel_reason))
        if error is not None and outcome in ("retried", "dead-lettered"):
            span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, error))


_NO_SPAN = AttemptSpan()
# Reusable: a null context holds nothing of a run (one made per attempt cost a no-op job more
# than the check around it).
_NO_SPAN_CONTEXT = contextlib.nullcontext(_NO_SPAN)


def tracing() -> bool:
    """Whether an attempt's span would be recorded: OpenTelemetry installed and a tracer
    provider set (the API alone, or a no-op provider, drops every span, and making one costs
    ~10 us an attempt). A provider, once set, stays: OpenTelemetry sets it once per process."""
    if otel_trace is None:
        return False
    if _SET.provider is not None:
        return True
    if _SET.environment_read and getattr(otel_trace, "_TRACER_PROVIDER", _SET) is None:
        # None set in code yet, and the environment named none when it was read: the look
        # below reads os.environ at every attempt until a provider is set, a thirtieth of
        # what a no-op job cost the worker (issue 44). OpenTelemetry's own global, read
        # where it keeps it; a version that keeps it elsewhere takes the look below.
        return False
    _SET.environment_read = True
    provider = otel_trace.get_tracer_provider()
    if isinstance(provider, _NO_PROVIDER):
        return False
    _SET.provider = provider
    return True


class _SET:
    """The tracer provider, once one is set (a cache: the check reads the environment each time
    until then); and whether the environment was read for one (OTEL_PYTHON_TRACER_PROVIDER,
    which OpenTelemetry reads until a provider is set): once, at the first attempt. A provider
    named there later, by the process itself, is not seen; one set in code is, at the next
    attempt."""

    provider: object | None = None
    environment_read = False


def attempt_span(
    claim: Claim, trace: Callable[[], Mapping[str, str]]
) -> contextlib.AbstractContextManager[AttemptSpan]:
    """One span around one attempt, current while its body runs (so the body's own spans are
    its children, in a sync body's thread too: Trio copies the context there). Its parent is
    the enqueue's span (``trace()``, read only when a span is made); a job enqueued outside any
    span starts a trace of its own, never one under whatever span the worker itself was
    started in."""
    if not tracing():
        # No tracer provider set (the API alone, or a no-op one): every span would be dropped,
        # and making one costs ~10 us an attempt; this look costs a fraction of one. A plain
        # context manager, not a generator's: the attempt's scaffolding is most of a no-op
        # job's cost to the worker (issue 16).
        return _NO_SPAN_CONTEXT
    return _recorded_span(claim, trace())


@contextlib.contextmanager
def _recorded_span(claim: Claim, trace: Mapping[str, str]) -> Iterator[AttemptSpan]:
    assert otel_trace is not None
    parent = _PROPAGATOR.extract(trace, context=otel_context.Context())
    with _TRACER.start_as_current_span(
        f"run {claim.name}",
        context=parent,
        kind=otel_trace.SpanKind.CONSUMER,
        attributes={
            "jobs_trio.job.name": claim.name,
            "jobs_trio.job.id": claim.job_id,
            "jobs_trio.job.attempt": claim.attempt,
            "jobs_trio.job.queue": claim.queue,
        },
        # The verdict, not the exception, says how an attempt ended (a body's errors are
        # caught by run_attempt; what escapes is the worker being cancelled from outside).
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield AttemptSpan(span)

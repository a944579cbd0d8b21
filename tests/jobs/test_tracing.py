# Tracing with OpenTelemetry's SDK and its in-memory exporter: one span per attempt, parented to
# the span that enqueued the job, with the attempt's outcome and cancel reason. Without
# OpenTelemetry installed: tests/jobs/test_no_otel.py.
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import trio
import trio.testing
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import jobs_trio
from jobs_trio.testing import memory_driver, new_worker, run_until_idle

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider (set once: OpenTelemetry refuses a second), exporting
    into memory; emptied around each test."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def attempts(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    found = [s for s in exporter.get_finished_spans() if s.name.startswith("run ")]
    return sorted(found, key=lambda s: s.attributes["jobs_trio.job.attempt"])  # type: ignore[index]


async def test_a_retried_job_has_one_span_per_attempt_under_the_enqueues_span(
    spans: InMemorySpanExporter, autojump_clock: trio.testing.MockClock
) -> None:
    registry = jobs_trio.Registry()
    contexts: list[dict[str, str]] = []

    @registry.job("t.flaky", queue="mail", backoff=jobs_trio.Backoff(base=1, jitter=0))
    async def flaky(ctx: jobs_trio.JobContext, payload: object) -> None:
        contexts.append(dict(ctx.context))
        if ctx.attempt == 1:
            raise ValueError("boom")

    driver = memory_driver()
    tracer = trace.get_tracer("the-app")
    with tracer.start_as_current_span("POST /signup") as request:
        job_id = await flaky.enqueue(driver, context={"tenant": "t1"})
    await run_until_idle(new_worker(driver, registry))

    first, second = attempts(spans)
    parent = request.get_span_context()
    for span, attempt, outcome in ((first, 1, "retried"), (second, 2, "completed")):
        assert span.name == "run t.flaky" and span.kind is trace.SpanKind.CONSUMER
        assert span.parent is not None and span.parent.span_id == parent.span_id
        assert span.context.trace_id == parent.trace_id
        assert dict(span.attributes or {}) == {
            "jobs_trio.job.name": "t.flaky",
            "jobs_trio.job.id": job_id,
            "jobs_trio.job.attempt": attempt,
            "jobs_trio.job.queue": "mail",
            "jobs_trio.outcome": outcome,
        }
    assert (first.status.status_code, first.status.description) == (
        StatusCode.ERROR,
        "ValueError: boom",
    )
    assert second.status.status_code is StatusCode.UNSET
    # The trace context is stored with the job, beside the application's context, and kept
    # out of ctx.context.
    stored = json.loads((await driver.get(job_id)).context)  # type: ignore[union-attr, arg-type]
    assert stored["tenant"] == "t1" and stored["traceparent"].split("-")[2] == (
        f"{parent.span_id:016x}"
    )
    assert contexts == [{"tenant": "t1"}, {"tenant": "t1"}]


async def test_a_cancelled_attempts_span_names_the_reason(
    spans: InMemorySpanExporter, autojump_clock: trio.testing.MockClock
) -> None:
    registry = jobs_trio.Registry()

    @registry.job("t.slow", timeout=1, attempts=1)
    async def slow(ctx: jobs_trio.JobContext, payload: object) -> None:
        await trio.sleep(10)

    driver = memory_driver()
    await slow.enqueue(driver)
    await run_until_idle(new_worker(driver, registry))
    [span] = attempts(spans)
    assert span.attributes is not None
    assert span.attributes["jobs_trio.outcome"] == "dead-lettered"
    assert span.attributes["jobs_trio.cancel_reason"] == "timeout"
    assert span.status.status_code is StatusCode.ERROR


async def test_a_bodys_own_spans_are_children_of_its_attempts_span_in_a_thread_too(
    spans: InMemorySpanExporter,
) -> None:
    registry = jobs_trio.Registry()
    tracer = trace.get_tracer("the-app")

    @registry.job("t.async")
    async def in_trio(ctx: jobs_trio.JobContext, payload: object) -> None:
        with tracer.start_as_current_span("query"):
            await trio.lowlevel.checkpoint()

    @registry.job("t.sync")
    def in_thread(ctx: jobs_trio.JobContext, payload: object) -> None:
        with tracer.start_as_current_span("query"):
            pass

    driver = memory_driver()
    await in_trio.enqueue(driver)
    await in_thread.enqueue(driver)
    await run_until_idle(new_worker(driver, registry))
    finished = spans.get_finished_spans()
    runs = {s.context.span_id: s for s in finished if s.name.startswith("run ")}
    queries = [s for s in finished if s.name == "query"]
    assert len(runs) == 2 and len(queries) == 2
    parents = {runs[q.parent.span_id].name for q in queries if q.parent}
    assert parents == {"run t.async", "run t.sync"}


async def test_a_job_enqueued_outside_any_span_starts_a_trace_of_its_own(
    spans: InMemorySpanExporter,
) -> None:
    registry = jobs_trio.Registry()

    @registry.job("t.plain")
    async def plain(ctx: jobs_trio.JobContext, payload: object) -> None:
        pass

    driver = memory_driver()
    job_id = await plain.enqueue(driver)
    assert (await driver.get(job_id)).context is None  # type: ignore[union-attr]
    # A worker started inside a span of its own: its jobs' spans are not that span's children.
    with trace.get_tracer("the-app").start_as_current_span("worker process"):
        await run_until_idle(new_worker(driver, registry))
    [span] = attempts(spans)
    assert span.parent is None


# In a fresh process: the look at the tracer provider is cached until one is set, and the
# cache must not hide one set in code later, nor one the environment names (issue 44).
_PROVIDER_LOOKS = """
import os, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from jobs_trio._core.tracing import tracing
if sys.argv[1] == "code":
    seen = [tracing(), tracing()]
    trace.set_tracer_provider(TracerProvider())
    seen.append(tracing())
else:
    seen = [tracing()]
print(seen)
"""


@pytest.mark.parametrize(
    ("how", "env", "seen"),
    [
        ("code", {}, "[False, False, True]"),
        ("env", {"OTEL_PYTHON_TRACER_PROVIDER": "sdk_tracer_provider"}, "[True]"),
    ],
)
def test_a_tracer_provider_set_after_the_first_look_is_seen(
    how: str, env: dict[str, str], seen: str
) -> None:
    environ = {k: v for k, v in os.environ.items() if k != "OTEL_PYTHON_TRACER_PROVIDER"}
    done = subprocess.run(
        [sys.executable, "-c", _PROVIDER_LOOKS, how],
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == seen

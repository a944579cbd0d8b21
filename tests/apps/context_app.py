# The jobs that tests/jobs/test_context_process.py runs in a real `jobs-trio worker` process: an
# application whose registry restores its tenant variable around each body.
# Apart from the test because the worker process imports it by name, as a user's app would be.
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping

import jobs_trio

# What the application's logging and database code read: set per request in a web process, and
# per job here, by the hook, from the context the request's enqueue stored.
tenant: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="none")


@contextlib.contextmanager
def restore_tenant(context: Mapping[str, str]) -> Iterator[None]:
    token = tenant.set(context.get("tenant", "none"))
    try:
        yield
    finally:
        tenant.reset(token)


registry = jobs_trio.Registry(restore_context=restore_tenant)


def _where_am_i() -> str:
    return tenant.get()  # as a helper deep in the application's code would read it


@registry.job("ctx.async")
async def in_trio(ctx: jobs_trio.JobContext, payload: object) -> dict[str, str]:
    return {"tenant": _where_am_i(), **{f"ctx.{k}": v for k, v in ctx.context.items()}}


@registry.job("ctx.sync")
def in_thread(ctx: jobs_trio.JobContext, payload: object) -> dict[str, str]:
    return {"tenant": _where_am_i(), **{f"ctx.{k}": v for k, v in ctx.context.items()}}

# The jobs of the dashboard's pause test in real worker processes (issue 46): one on the queue the
# test pauses, and one canary per worker on a queue of its own, whose run shows that worker
# claimed again after the pause. Apart because the CLI imports it by name.
from __future__ import annotations

from typing import Any

import jobs_trio

registry = jobs_trio.Registry()


@registry.job("pause.mail", queue="mail")
async def mail(ctx: jobs_trio.JobContext, payload: Any) -> str:
    return f"sent {payload}"


@registry.job("pause.canary_a", queue="canary-a")
async def canary_a(ctx: jobs_trio.JobContext, payload: Any) -> str:
    return "a"


@registry.job("pause.canary_b", queue="canary-b")
async def canary_b(ctx: jobs_trio.JobContext, payload: Any) -> str:
    return "b"

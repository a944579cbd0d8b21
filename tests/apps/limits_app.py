# The jobs tests/run/test_limits_processes.py runs in real `jobs-trio worker` processes: one limited
# to 2 bodies at once fleet-wide, one to 20 starts per second; each appends its times to a file
# (the paced one, its start and when its claim granted it).
# Apart from the test because each worker process imports it by name, as a user's app would be.
from __future__ import annotations

import time
from typing import Any

import trio

import jobs_trio
from tests.apps.settle_app import _append  # one atomic line per write: processes never mix

registry = jobs_trio.Registry()


@registry.job("limits.two", queue="two", fleet_limit=jobs_trio.FleetLimit(2))
async def two(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
    started = time.time()
    await trio.sleep(payload["seconds"])
    _append(payload["log"], f"{started!r} {time.time()!r} {ctx.job_id} {ctx.worker_id}")


@registry.job("limits.paced", queue="paced", rate_limit=jobs_trio.RateLimit(20, per=1.0))
async def paced(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
    # The rate is promised at the claim (docs/limits.md, "The burst"): when the start was
    # granted, on the driver's clock, is the claim's lease end less the lease the workers were
    # given (the payload says which). Read from the claim the context holds: no public field
    # tells it, and the test measures exactly what the limit bounds.
    granted = ctx._claim.lease_until - payload["lease"]
    _append(payload["log"], f"{time.time()!r} {granted!r} {ctx.job_id} {ctx.worker_id}")

# The cron task that tests/cron/test_task_processes.py fires from real `jobs-trio worker` processes.
# Apart from the test because each worker process imports it by name, as a user's app would be.
from __future__ import annotations

from typing import Any

import jobs_trio

registry = jobs_trio.Registry()


@registry.task("cron.tick", cron="* * * * * *", queue="cron")
async def tick(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> float:
    # The fire's own record (its payload) is what the test reads; the body only completes.
    scheduled: float = payload["scheduled_ts"]
    return scheduled

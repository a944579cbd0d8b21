# A registry whose one job answers how the worker process's garbage collector is set, for
# tests/ops/test_worker_gc.py. With JOBS_TRIO_TEST_GC set, this module sets its own thresholds
# as an application that tuned its collector would.
from __future__ import annotations

import gc
import os
from typing import Any

import jobs_trio

if os.environ.get("JOBS_TRIO_TEST_GC"):
    gc.set_threshold(*(int(n) for n in os.environ["JOBS_TRIO_TEST_GC"].split(",")))

registry = jobs_trio.Registry()


@registry.job("gc.settings")
async def settings(ctx: jobs_trio.JobContext, payload: Any) -> dict[str, Any]:
    return {"thresholds": list(gc.get_threshold()), "frozen": gc.get_freeze_count()}

# The jobs tests/ops/test_cli.py enqueues with `--app` and settles with a worker's tick().
# Apart from the test because the CLI imports it by name (`tests.apps.cli_app`).
from __future__ import annotations

from typing import Any

import jobs_trio

registry = jobs_trio.Registry()


@registry.job("app.hello", queue="greetings", attempts=5)
async def hello(ctx: jobs_trio.JobContext, payload: Any) -> dict[str, Any]:
    return {"hello": payload}


@registry.job("app.fail", attempts=1)
async def fail(ctx: jobs_trio.JobContext, payload: Any) -> None:
    raise RuntimeError("boom on purpose")


async def _double(n: int) -> int:
    return 2 * n


@registry.job("app.steps")
async def steps(ctx: jobs_trio.JobContext, payload: dict[str, int]) -> int:
    doubled: int = await ctx.step.run("double", _double, payload["n"])
    return doubled + 1

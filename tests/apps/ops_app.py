# The jobs the operator-facing tests run in real worker processes (issue 36): a job that
# returns, one that fails with a multi-line, quoted message (a traceback in every log format),
# both on the "ops" queue. Apart because the CLI imports it by name (`tests.apps.ops_app`).
from __future__ import annotations

from typing import Any

import jobs_trio

registry = jobs_trio.Registry()


@registry.job("ops.ok", queue="ops")
async def ok(ctx: jobs_trio.JobContext, payload: Any) -> dict[str, Any]:
    return {"echo": payload}


@registry.job("ops.fail", queue="ops", attempts=1)
async def fail(ctx: jobs_trio.JobContext, payload: Any) -> None:
    raise RuntimeError('line one\nline "two" = \x1b[31mred')

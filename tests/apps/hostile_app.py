# A job whose error text carries terminal escapes, for tests/ops/test_cli_safety.py: `list` and
# `show` must print that text escaped. Apart because a worker imports it by name.
from __future__ import annotations

from typing import Any

import jobs_trio

# An OSC 8 hyperlink: a terminal shows "click here" and hides where it leads.
HIDDEN_LINK = "\x1b]8;;https://evil.example/\x1b\\click here\x1b]8;;\x1b\\"

registry = jobs_trio.Registry()


@registry.job("hostile.fail", attempts=1)
async def fail(ctx: jobs_trio.JobContext, payload: Any) -> None:
    raise RuntimeError(f"see {HIDDEN_LINK} for details")

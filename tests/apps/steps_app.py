# A three-step job for tests/jobs/test_steps_process.py: each step appends a line to a file, and
# the third step's first run awaits long enough for the test to send SIGTERM during it.
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import trio

import jobs_trio

registry = jobs_trio.Registry()


def _note(path: str, line: str) -> int:
    with open(path, "a") as f:
        f.write(line + "\n")
    return len(Path(path).read_text().splitlines())


@registry.job("steps.three", timeout=300)
async def three(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> list[int]:
    log = payload["log"]
    results = []
    for n in (1, 2, 3):

        async def step(n: int = n) -> int:
            _note(log, f"step{n} start")
            first_time = Path(log).read_text().count(f"step{n} start") == 1
            if n == 3 and first_time:
                await trio.sleep(60)
            _note(log, f"step{n} done")
            return n

        results.append(await ctx.step.run(f"step{n}", step))
    return results


async def main(url: str) -> None:
    async with (
        jobs_trio.open_driver(url) as driver,
        jobs_trio.open_lifecycle(grace=25) as lifecycle,
        jobs_trio.open_worker(driver, registry, lifecycle=lifecycle),
    ):
        await trio.sleep_forever()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    trio.run(main, sys.argv[1])

# A small Trio application, written as a user would: a worker under the lifecycle, with a job
# that awaits a minute. tests/run/test_drain_process.py sends it a real SIGTERM.
from __future__ import annotations

import logging
import sys

import trio

import jobs_trio

registry = jobs_trio.Registry()


@registry.job("report.build", timeout=300, attempts=1)
async def build_report(ctx: jobs_trio.JobContext, payload: dict[str, int]) -> str:
    await trio.sleep(60)  # an HTTP call, a query: anything that awaits
    return "built"


async def main(url: str) -> None:
    async with (
        jobs_trio.open_driver(url) as driver,
        jobs_trio.open_lifecycle(grace=25) as lifecycle,
        jobs_trio.open_worker(driver, registry, lifecycle=lifecycle, concurrency=4),
    ):
        await trio.sleep_forever()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    trio.run(main, sys.argv[1])

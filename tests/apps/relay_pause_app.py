# A relay through the API for tests/outbox/test_relay_pause_processes.py: `open_relay` on the
# application's database and the job store, a short lease, until SIGTERM. Apart because the test
# SIGSTOPs it for real, as `jobs-trio relay` is: a process of its own, with no hook in it.
from __future__ import annotations

import logging
import sys
from typing import Any

import trio

import jobs_trio


async def relay(app_url: str, app_schema: str, jobs_url: str, schema: str, lease: str) -> None:
    app_options: dict[str, Any] = {"schema": app_schema} if app_url.startswith("postgres") else {}
    jobs_options: dict[str, Any] = {"schema": schema} if jobs_url.startswith("postgres") else {}
    async with (
        jobs_trio.open_driver(app_url, **app_options) as app_db,
        jobs_trio.open_driver(jobs_url, **jobs_options) as store,
        jobs_trio.open_lifecycle(grace=10) as lifecycle,
        jobs_trio.open_relay(
            jobs_trio.Outbox(app_db),
            store,
            lease=float(lease),
            poll_interval=0.05,
            lifecycle=lifecycle,
        ),
    ):
        await trio.sleep_forever()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    trio.run(relay, *sys.argv[1:6])

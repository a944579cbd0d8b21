# What completes a docs page's fragment into a program (issue 47): each `<!-- prelude: NAME ... -->`
# block runs inside its template here, the fragment in place of `{fragment}` (indented to it),
# after the page's earlier `# file:` blocks are saved. Apart from test_docs.py so that what the
# pages leave out, and say they leave out, is read in one place.
from __future__ import annotations

import attrs


@attrs.frozen
class Prelude:
    template: str  # a program with one line `{fragment}`, indented where the fragment goes
    # Runs against a database of its own (one a page, made for the test), its URL in $JOBS_URL.
    postgres: bool = False

    def complete(self, fragment: str) -> str:
        [line] = [ln for ln in self.template.splitlines() if ln.strip() == "{fragment}"]
        indent = line[: len(line) - len(line.lstrip())]
        body = "".join(indent + ln if ln.strip() else ln for ln in fragment.splitlines(True))
        return self.template.replace(line + "\n", body)


_JOB_RUN = """
async def main() -> None:
    driver = memory_driver()
    job_id = await {job}.enqueue(driver, {payload})
    await run_until_idle(new_worker(driver, registry))
    job = await driver.get(job_id)
    assert job is not None and job.state is jobs_trio.JobState.COMPLETED, job


trio.run(main{clock})
"""
# A mock clock for async bodies; a sync body runs in a thread, which the mock clock would jump
# past (its timeout firing while the thread works).
_MOCK = ", clock=trio.testing.MockClock(autojump_threshold=0)"

_JOBS = """
import trio
import trio.testing

import jobs_trio
from jobs_trio.testing import memory_driver, new_worker, run_until_idle

registry = jobs_trio.Registry()
"""

PRELUDES = {
    "reports-build": Prelude(
        _JOBS
        + """

async def fetch_rows(month: str):
    for day in range(3):
        yield {"month": month, "day": day}


async def save_partial(month: str, rows: list) -> None:
    pass


{fragment}
"""
        + _JOB_RUN.format(job="build", payload='{"month": "2026-11"}', clock=_MOCK)
    ),
    "images-resize": Prelude(
        _JOBS
        + """

def shrink(path: str) -> None:
    pass


{fragment}
"""
        + _JOB_RUN.format(job="resize", payload='{"paths": ["a.png", "b.png"]}', clock="")
    ),
    "order-workflow": Prelude(
        _JOBS
        + """
import types


async def _charge(order: str, amount: int) -> str:
    return f"charge-{order}"


async def _send(order: str, carrier: str) -> None:
    pass


payments = types.SimpleNamespace(charge=_charge)
mailer = types.SimpleNamespace(send=_send)


{fragment}


async def main() -> None:
    driver = memory_driver()
    job_id = await fulfil.enqueue(driver, {"order": "o-1", "amount": 30})
    worker = new_worker(driver, registry)
    await run_until_idle(worker)  # the day's sleep passes on the mock clock
    await jobs_trio.send_event(driver, "order.shipped", {"carrier": "ups"}, key="o-1")
    await run_until_idle(worker)
    job = await driver.get(job_id)
    assert job is not None and job.result == {"charge": "charge-o-1"}, job


trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
"""
    ),
    "orders-postgres": Prelude(
        """
import os

import trio

import jobs_trio

registry = jobs_trio.Registry()


@registry.job("orders.confirm")
async def confirm(ctx: jobs_trio.JobContext, payload: dict) -> None:
    pass


async def main() -> None:
    async with jobs_trio.open_driver(os.environ["JOBS_URL"], migrate=True) as driver:
        async with jobs_trio.transaction(driver) as tx:
            await tx.execute("CREATE TABLE orders (id serial PRIMARY KEY, item text)")
        item = "book"
        {fragment}
        [job] = await driver.list_jobs(name="orders.confirm")
        assert job.payload == f'{{"order":{order_id}}}', job


trio.run(main)
""",
        postgres=True,
    ),
    "outbox": Prelude(
        """
import sqlite3

import trio

import jobs_trio

registry = jobs_trio.Registry()


@registry.job("orders.confirm")
async def confirm(ctx: jobs_trio.JobContext, payload: dict) -> None:
    pass


app_url, jobs_url = "sqlite:///app.db", "sqlite:///jobs.db"
order_id = 7


async def main() -> None:
    async with jobs_trio.open_driver(app_url):  # made a jobs_trio file first, then the app's
        pass
    with sqlite3.connect("app.db") as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    async with jobs_trio.open_lifecycle(grace=5, signals=()) as lifecycle:
        {fragment}
    # The row committed: still in the outbox, or moved by the relay's pass while it ran.
    async with jobs_trio.open_driver(app_url) as app_db, jobs_trio.open_driver(jobs_url) as jobs:
        pending = (await app_db.outbox_stats()).pending
        assert pending + len(await jobs.list_jobs(name="orders.confirm")) == 1


trio.run(main)
"""
    ),
    "flask": Prelude(
        """
import os
import types

import trio

import jobs_trio


async def migrate() -> None:
    async with jobs_trio.open_driver("sqlite:///jobs.db"):
        pass


trio.run(migrate)
os.environ["JOBS_URL"] = "sqlite:///jobs.db"


class App:  # what the fragment takes of Flask: a route decorator
    def post(self, path):
        return lambda view: view


app = App()
request = types.SimpleNamespace(form={"email": "ada@example.com"})

{fragment}

answer = signup()
assert answer["job"], answer
"""
    ),
    "psycopg": Prelude(
        """
import os

import psycopg
import trio

import jobs_trio
import jobs_trio.sync
from signup_jobs import welcome


async def migrate() -> None:
    async with jobs_trio.open_driver(os.environ["JOBS_URL"], migrate=True):
        pass


trio.run(migrate)
producer = jobs_trio.sync.Producer(os.environ["JOBS_URL"])
email = "ada@example.com"
with psycopg.connect(os.environ["JOBS_URL"]) as conn:
    conn.execute("CREATE TABLE IF NOT EXISTS signups (email text)")
    conn.commit()
    {fragment}
    assert conn.execute("SELECT count(*) FROM jobs_trio.jobs").fetchone()[0] >= 1
""",
        postgres=True,
    ),
    "django": Prelude(
        """
import django
import trio
from django.conf import settings

import jobs_trio
import jobs_trio.sync
from signup_jobs import welcome


async def migrate() -> None:
    async with jobs_trio.open_driver("sqlite:///site.db"):
        pass


trio.run(migrate)
settings.configure(
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "site.db"}}
)
django.setup()
producer = jobs_trio.sync.Producer("sqlite:///site.db")

{fragment}

with connection.cursor() as cursor:
    cursor.execute("CREATE TABLE signups (email text)")
signup("ada@example.com")
with connection.cursor() as cursor:
    cursor.execute("SELECT count(*) FROM jobs")
    assert cursor.fetchone() == (1,)
"""
    ),
    "fastapi": Prelude(
        """
import asyncio
import os

import asyncpg
import trio

import jobs_trio
from signup_jobs import welcome


async def migrate() -> None:
    async with jobs_trio.open_driver(os.environ["JOBS_URL"], migrate=True):
        pass


trio.run(migrate)


class App:  # what the fragment takes of FastAPI: a route decorator
    def post(self, path):
        return lambda endpoint: endpoint


app = App()
pool = None

{fragment}


async def serve() -> None:
    global pool
    pool = await asyncpg.create_pool(os.environ["JOBS_URL"])
    async with pool.acquire() as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS signups (email text)")
    async with lifespan(app):
        answer = await signup("ada@example.com")
    assert answer["job"], answer
    await pool.close()


asyncio.run(serve())
""",
        postgres=True,
    ),
}

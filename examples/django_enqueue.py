"""Enqueue from Django inside ``transaction.atomic()``: the job exists if and only if the view's
transaction commits. A whole Django project in one file, run by tests/produce/test_django.py:

    python examples/django_enqueue.py sqlite:///django-jobs.db
    python examples/django_enqueue.py postgresql://postgres@127.0.0.1/postgres [SCHEMA]

The jobs live in Django's own database (the SQLite file, or a schema of the PostgreSQL
database), so one commit covers the signup row and its job. A Trio worker then runs them."""

from __future__ import annotations

import contextlib
import sys
from typing import Any
from urllib.parse import urlsplit

import django
import trio
from django.conf import settings
from django.db import connection, transaction

import jobs_trio
import jobs_trio.sync
from jobs_trio.testing import new_worker, run_until_idle

registry = jobs_trio.Registry()


@registry.job("emails.welcome")
async def welcome(ctx: jobs_trio.JobContext, payload: dict[str, str]) -> str:
    return f"welcome sent to {payload['to']}"


def django_database(url: str) -> dict[str, Any]:
    """settings.DATABASES["default"] for the URL the workers use."""
    if url.startswith("sqlite:///"):
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": url.removeprefix("sqlite:///")}
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",  # psycopg 3
        "NAME": parts.path.lstrip("/") or "postgres",
        "USER": parts.username or "",
        "PASSWORD": parts.password or "",
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


# One producer for the process, made once (a module of the Django project would hold it).
producer: jobs_trio.sync.Producer


signups = "signups"  # the application's table (on PostgreSQL, beside the jobs' schema)


def signup(email: str, *, declined: bool = False) -> None:
    """A view's body: the signup row and the welcome job, in one transaction."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {signups} (email) VALUES (%s)", [email])
        producer.enqueue(welcome, {"to": email}, key=f"welcome:{email}", connection=connection)
        if declined:
            raise ValueError("card declined")  # atomic() rolls back: row and job alike


async def prepare(url: str, **schema: Any) -> None:
    """What a deploy does before the web processes start: `jobs-trio migrate --db URL`."""
    async with jobs_trio.open_driver(url, migrate=True, **schema):
        pass


async def run_the_jobs(url: str, **schema: Any) -> list[str]:
    """A Trio worker (its own process in production) runs what was committed."""
    async with jobs_trio.open_driver(url, **schema) as driver:
        outcomes = await run_until_idle(new_worker(driver, registry), wait=False)
        return [str((await driver.get(o.job_id)).result) for o in outcomes]  # type: ignore[union-attr]


def main(url: str, schema: str = "jobs_trio") -> None:
    global producer, signups
    on_postgres = not url.startswith("sqlite:")
    options: dict[str, Any] = {"schema": schema} if on_postgres else {}
    trio.run(lambda: prepare(url, **options))
    settings.configure(DATABASES={"default": django_database(url)})
    django.setup()
    if on_postgres:
        signups = f'"{schema}".signups'
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {signups} (email varchar(200))")
    producer = jobs_trio.sync.Producer(url, **options)
    signup("ada@example.com")
    with contextlib.suppress(ValueError):
        signup("bob@example.com", declined=True)
    producer.close()
    for result in trio.run(lambda: run_the_jobs(url, **options)):
        print(result)


if __name__ == "__main__":
    main(*sys.argv[1:3] if len(sys.argv) > 1 else ["sqlite:///django-jobs.db"])

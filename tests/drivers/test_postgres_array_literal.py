# The array literal a PostgreSQL settle sends its text columns as (_settle_statements._text_array):
# whatever text a list holds, PostgreSQL reads back the same list, NULLs and all. Checked against
# the server's own parser, with the characters its literal syntax gives a meaning to.
from __future__ import annotations

import random

import pytest

from tests.conftest import require_postgres

pytest.importorskip("asyncpg")
pytest.importorskip("trio_asyncio")

from jobs_trio.drivers.postgres import open_postgres_driver
from jobs_trio.drivers.postgres._settle_statements import (
    _bool_array,
    _number_array,
    _seconds_array,
    _text_array,
)

# What the literal syntax gives a meaning to, and some it does not; no NUL (PostgreSQL's text
# holds none, whichever way it is sent).
ALPHABET = " \t\n\r\x0b\x0c{}\",\\NULLnul()[]:;-_'aé🎉\u202e\u3000"


def _lists(count: int) -> list[list[str | None]]:
    rng = random.Random(44)
    made: list[list[str | None]] = [
        [],
        [None],
        [None, None],
        [""],
        ["NULL"],
        ["null", "x"],
        ["Null", "NuLL"],
        ["NULL", "null", "Null", " NULL "],
        ["a", None, "b"],
        ["1a248c69d1b0000d7f54ac47c9b", "351aa3ef-cf6b-4c6f-b359-8c3e1b9e2f10"],
    ]
    for _ in range(count):
        made.append(
            [
                None
                if rng.random() < 0.1
                else "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 12)))
                for _ in range(rng.randrange(1, 6))
            ]
        )
    return made


async def test_every_list_of_text_reads_back_as_it_was(pg_schema: str) -> None:
    lists = _lists(400)
    async with open_postgres_driver(
        require_postgres(), schema=pg_schema, migrate=True, drop_schema_on_close=True
    ) as driver:

        async def read_back(conn: object) -> list[list[str | None]]:
            fetchval = conn.fetchval  # type: ignore[attr-defined]
            return [list(await fetchval("SELECT $1::text::text[]", _text_array(v))) for v in lists]

        assert await driver.bridge.run(read_back, what="array literals") == lists

        async def bools(conn: object) -> list[bool]:
            fetchval = conn.fetchval  # type: ignore[attr-defined]
            return list(await fetchval("SELECT $1::text::bool[]", _bool_array([True, False])))

        assert await driver.bridge.run(bools, what="bool literal") == [True, False]

        # Numbers as their repr: each float reads back as the same float, to the last bit.
        rng = random.Random(45)
        floats: list[float | None] = [0.1, 1e-300, 5e-324, 1.7976931348623157e308, -0.0, None]
        floats += [rng.uniform(0, 3600) for _ in range(200)] + [
            rng.random() / 1e6 for _ in range(50)
        ]
        ints: list[int | None] = [0, 1, -5, 2**31 - 1, None]

        async def numbers(conn: object) -> tuple[list[float | None], list[int | None]]:
            fetchval = conn.fetchval  # type: ignore[attr-defined]
            return (
                list(await fetchval("SELECT $1::text::float8[]", _number_array(floats))),
                list(await fetchval("SELECT $1::text::int[]", _number_array(ints))),
            )

        assert await driver.bridge.run(numbers, what="number literals") == (floats, ints)


async def test_durations_read_back_to_the_nanosecond(pg_schema: str) -> None:
    """An attempt's seconds go as whole nanoseconds (_seconds_array): each reads back within
    half a nanosecond of what was measured, NULL as NULL, and a value no clock should give
    (inf, nan) is still written rather than failing the settle."""
    rng = random.Random(46)
    seconds: list[float | None] = [0.0, 7.123456789e-06, 2.0, 1e-12, 86_400.5, None]
    seconds += [rng.uniform(0, 3600) for _ in range(200)] + [rng.random() / 1e4 for _ in range(50)]
    async with open_postgres_driver(
        require_postgres(), schema=pg_schema, migrate=True, drop_schema_on_close=True
    ) as driver:

        async def read(conn: object, values: list[float | None]) -> list[float | None]:
            fetchval = conn.fetchval  # type: ignore[attr-defined]
            return list(await fetchval("SELECT $1::text::float8[]", _seconds_array(values)))

        back = await driver.bridge.run(lambda conn: read(conn, seconds), what="seconds")
        assert [v is None for v in back] == [v is None for v in seconds]
        for sent, got in zip(seconds, back, strict=True):
            if sent is not None:
                assert got is not None, sent
                assert abs(got - sent) <= 0.5e-9 + abs(sent) * 1e-15, (sent, got)
        assert back[2] == 2.0  # a whole number of nanoseconds, exactly
        odd = [float("inf"), 1.5]
        assert await driver.bridge.run(lambda conn: read(conn, odd), what="odd") == odd
        assert await driver.bridge.run(lambda conn: read(conn, []), what="none") == []

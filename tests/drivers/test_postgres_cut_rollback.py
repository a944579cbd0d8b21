# How long a transaction cut by a cancel waits for its rollback, by whose connection it is: the
# pool's waits CLOSE_SECONDS and then drops it; the application's own waits CLEANUP_SECONDS.
# Apart because it drives the bridge's _in_transaction with a stand-in connection, no server.
from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("asyncpg")

from jobs_trio.drivers import _postgres_bridge as bridge


class _SlowRollback:
    """A connection whose rollback is served after ``seconds``, as over a slow link."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.terminated = False
        self.rolled_back = False

    def transaction(self) -> _SlowRollback:
        return self

    async def start(self) -> None:
        pass

    async def rollback(self) -> None:
        await asyncio.sleep(self.seconds)
        self.rolled_back = True

    def terminate(self) -> None:
        self.terminated = True


async def _cut(conn: Any) -> None:
    raise asyncio.CancelledError  # the drain's cancel, thrown into the operation


def _run(conn: _SlowRollback, unanswered: Any) -> None:
    async def main() -> None:
        with pytest.raises(asyncio.CancelledError):
            await bridge._in_transaction(conn, _cut, unanswered=unanswered)

    asyncio.run(main())


def test_a_cut_pooled_transaction_drops_its_connection_after_close_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bridge, "CLOSE_SECONDS", 0.05)
    told: list[bool] = []
    conn = _SlowRollback(0.3)
    _run(conn, lambda: told.append(True))
    assert conn.terminated and not conn.rolled_back and told == [True]


def test_the_application_s_connection_waits_cleanup_seconds_for_its_rollback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Review of e5d7460: over a link of 0.25 s each way the 1 s bound closed the caller's
    # own connection, which the rollback would have left usable.
    monkeypatch.setattr(bridge, "CLOSE_SECONDS", 0.05)
    conn = _SlowRollback(0.3)
    _run(conn, None)
    assert conn.rolled_back and not conn.terminated

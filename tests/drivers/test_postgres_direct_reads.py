# The PostgreSQL driver's pooled connections read by the Trio task that uses them
# (drivers/direct_reads.py): one task woken per round trip, and nothing the loop's reading did
# is lost with it (a connection killed while idle, a stalled server, a close).
from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from jobs_trio._core.errors import DriverError
from tests.conftest import require_postgres
from tests.drivers.test_postgres_driver import driver_and_admin, eventually, open_admin

pytestmark = pytest.mark.postgres

asyncpg = pytest.importorskip("asyncpg")

from jobs_trio.drivers import _postgres_bridge as postgres_bridge  # noqa: E402
from jobs_trio.drivers._postgres_open import open_bridge  # noqa: E402
from jobs_trio.drivers.postgres import open_postgres_driver  # noqa: E402


@pytest.fixture
def url() -> str:
    return require_postgres()


async def backend_pid(bridge: Any) -> int:
    """The server process of the pooled connection the next operation runs on."""
    pid: int = await bridge.run(
        lambda conn: conn.fetchval("SELECT pg_backend_pid()"), what="its backend"
    )
    return pid


def own_schema(url: str, pg_schema: str, *, pool_size: int) -> Any:
    """A driver on a schema of its own, dropped after, with ``pool_size`` connections."""
    return open_postgres_driver(
        url, schema=pg_schema, migrate=True, drop_schema_on_close=True, pool_size=pool_size
    )


class StepCounter(trio.abc.Instrument):
    """Which tasks ran, by name, while it was attached."""

    def __init__(self) -> None:
        self.stepped: dict[str, int] = {}

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.stepped[task.name] = self.stepped.get(task.name, 0) + 1


async def test_a_pooled_round_trip_wakes_only_the_task_that_made_it(
    url: str, pg_schema: str
) -> None:
    async with own_schema(url, pg_schema, pool_size=1) as driver:
        for _ in range(3):  # the connection is open and the statement prepared
            assert await driver.get("no-such-job") is None
        me = trio.lowlevel.current_task().name
        counter = StepCounter()
        trio.lowlevel.add_instrument(counter)
        try:
            for _ in range(20):
                assert await driver.get("no-such-job") is None
        finally:
            trio.lowlevel.remove_instrument(counter)
        # The reply wakes this task and nothing else on the way. Through the loop it would
        # also wake the loop's reader task for the socket, which hands it to the loop's own
        # task, which wakes this one, and then waits for the loop once more; and asyncpg's own
        # done callback for the reply would take the loop's task one more pass.
        assert counter.stepped == {me: 20}, counter.stepped


async def test_pooled_connections_the_server_closed_while_idle_are_replaced_at_checkout(
    url: str, pg_schema: str
) -> None:
    async with driver_and_admin(url, pg_schema, pool_size=2) as (driver, admin):
        pool_name = driver.bridge.application_name + ":pool"

        # Two connections open at once, both idle in the pool afterwards.
        async def sleep_a_little() -> None:
            await driver.bridge.run(
                lambda conn: conn.execute("SELECT pg_sleep(0.2)"), what="two at once"
            )

        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(sleep_a_little)
        killed = await admin.kill(pool_name)
        assert len(killed) == 2

        async def all_gone() -> bool:
            return not set(killed) & set(await admin.backends(pool_name))

        await eventually(all_gone)
        # Nobody read those sockets since: the checkout reads the server's goodbye and opens a
        # fresh connection instead of failing the operation with a lost connection.
        for _ in range(3):
            assert await driver.get("no-such-job") is None
        assert not set(killed) & set(await admin.backends(pool_name))


async def test_closing_the_driver_closes_its_pooled_connections_cleanly(
    url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # asyncpg's close waits for the server's end of the connection, which only a reader of the
    # socket sees: had the loop not been reading again, each close would wait out its bound
    # (CLEANUP_SECONDS) and be cut short there.
    monkeypatch.setattr(postgres_bridge, "CLEANUP_SECONDS", 2.0)
    ends: list[str] = []
    close = asyncpg.Connection.close

    async def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            await close(self, *args, **kwargs)
        except BaseException:
            ends.append("cut short")
            raise
        ends.append("closed")

    monkeypatch.setattr(asyncpg.Connection, "close", spy)
    async with own_schema(url, pg_schema, pool_size=2) as driver:
        assert await driver.get("no-such-job") is None
    assert ends and set(ends) == {"closed"}, ends


async def test_a_cancel_reaching_a_stalled_server_ends_within_the_cleanup_bound(
    url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rollback after a cancel waits on asyncio's timer, not on a reply: the loop must be
    # able to end the operation's wait for the socket, or a stalled server hangs it forever.
    monkeypatch.setattr(postgres_bridge, "CLEANUP_SECONDS", 0.5)
    async with own_schema(url, pg_schema, pool_size=1) as driver:
        pid = await backend_pid(driver.bridge)
        scope = trio.CancelScope()
        stopped = trio.Event()

        stalled: list[Any] = []

        async def stalls(conn: Any) -> None:
            stalled.append(conn)
            os.kill(pid, signal.SIGSTOP)
            stopped.set()
            await conn.execute("SELECT 1")

        woken_by_hand = False

        async def wake_the_server_at_last() -> None:
            # A hang would otherwise leave the backend stopped and this test stuck in the
            # shielded cleanup, for good: after 10 s the connection is ended by hand (its wait
            # for the socket woken, its transport aborted) and the test fails.
            nonlocal woken_by_hand
            await trio.sleep(10)
            woken_by_hand = True
            [conn] = stalled
            trio.lowlevel.notify_closing(conn._transport._sock_fd)
            conn.terminate()
            os.kill(pid, signal.SIGCONT)

        async def run() -> None:
            with scope:
                await driver.bridge.run(stalls, what="a stalled write", transaction=True)

        try:
            async with trio.open_nursery() as watchdog:
                watchdog.start_soon(wake_the_server_at_last)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(run)
                    await stopped.wait()
                    scope.cancel()
                watchdog.cancel_scope.cancel()
        finally:
            os.kill(pid, signal.SIGCONT)
        assert not woken_by_hand, "the cancelled operation waited for the stalled server"
        assert scope.cancelled_caught
        # The stalled connection was terminated; the next operation gets a fresh one.
        assert await driver.get("no-such-job") is None
        assert pid != await backend_pid(driver.bridge)


async def test_a_read_wait_that_fails_ends_the_connection_as_lost(url: str, pg_schema: str) -> None:
    # Should the socket be closed under the wait (here: Trio told it is closing), nothing can
    # read that connection again: it is ended and the operation fails as a lost connection,
    # rather than waiting for a reply nobody reads.
    async with own_schema(url, pg_schema, pool_size=1) as driver:
        waiting: list[Any] = []

        async def slow(conn: Any) -> None:
            waiting.append(conn)
            await conn.execute("SELECT pg_sleep(30)")

        async def close_under_it() -> None:
            while not waiting:
                await trio.sleep(0)
            await trio.sleep(0)  # the operation is now waiting for the socket
            trio.lowlevel.notify_closing(waiting[0]._transport._sock_fd)

        with trio.fail_after(15):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(close_under_it)
                with pytest.raises(DriverError) as raised:
                    await driver.bridge.run(slow, what="a slow query")
        assert "lost the connection" in raised.value.cause
        assert await driver.get("no-such-job") is None


async def test_a_checkout_takes_a_connection_whose_socket_number_is_past_1024(
    url: str, pg_schema: str
) -> None:
    # A process with many files open (a web server's sockets, a worker's threads) opens the
    # pool's sockets past select()'s FD_SETSIZE; the look at an idle connection must still work.
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2048
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"at most {hard} open files here")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    fillers: list[int] = []
    try:
        while not fillers or fillers[-1] < 1100:
            fillers.append(os.open(os.devnull, os.O_RDONLY))
        async with own_schema(url, pg_schema, pool_size=1) as driver:
            conns: list[Any] = []

            async def its_socket(conn: Any) -> int:
                conns.append(conn)
                return int(conn._transport._sock_fd)

            assert await driver.bridge.run(its_socket, what="its socket") > 1024
            for _ in range(3):  # each a checkout of the idle connection
                assert await driver.get("no-such-job") is None
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def _until_sleeping(admin: Any, pid: int) -> None:
    """Until the backend ``pid`` runs the test's ``SELECT pg_sleep(30)``."""

    async def sleeping() -> bool:
        found = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE pid = $1 AND state = 'active' AND query LIKE '%pg_sleep(30)%'",
            pid,
        )
        return bool(found == 1)

    await eventually(sleeping)


@contextlib.asynccontextmanager
async def a_long_statement_cancelled(
    driver: Any, admin: Any, pid: int, *, transaction: bool
) -> AsyncIterator[None]:
    """Run a 30 s statement on the backend ``pid``, cancel it (a Trio cancel) once the server
    runs it, and enter the block at once: no pass of the scheduler since the cancel."""
    scope = trio.CancelScope()

    async def cancel_once_running() -> None:
        await _until_sleeping(admin, pid)
        scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_once_running)
        with scope:
            await driver.bridge.run(
                lambda conn: conn.execute("SELECT pg_sleep(30)"),
                what="a long statement",
                transaction=transaction,
            )
        yield
    assert scope.cancelled_caught


@pytest.mark.parametrize("transaction", [False, True], ids=["alone", "in-a-transaction"])
async def test_the_next_operation_right_after_a_cancelled_one_runs_on_a_fresh_connection(
    url: str, pg_schema: str, transaction: bool
) -> None:
    # `with trio.move_on_after(...)` around a driver call, then the next call at once, in the
    # same task and with no pass of the scheduler in between. A connection whose statement a
    # cancel cut short is never handed on (issue 32: under pg_terminate_backend chaos one was,
    # and its next statement failed "cannot switch to state 12; another operation (2) is in
    # progress"): the next operation opens a fresh one, and the cancelled statement is
    # cancelled on the server, not left to run its 30 s.
    async with driver_and_admin(url, pg_schema, pool_size=1) as (driver, admin):
        pid = await backend_pid(driver.bridge)
        async with a_long_statement_cancelled(driver, admin, pid, transaction=transaction):
            assert await backend_pid(driver.bridge) != pid

        async def gone_or_idle() -> bool:
            state = await admin.fetchval("SELECT state FROM pg_stat_activity WHERE pid = $1", pid)
            return state in (None, "idle")

        await eventually(gone_or_idle, within=2)


async def test_closing_the_bridge_under_a_running_operation_leaves_the_loop_no_error(
    url: str,
) -> None:
    # Bridge.aclose closes every connection, those an operation still runs on too. Handing such
    # a connection's reading back to the loop while the operation's task waits for its socket
    # made the loop's reader fail ("another task is already reading / writing this fd").
    errors: list[dict[str, Any]] = []
    ended: list[str] = []
    async with open_admin(url) as admin, trio.open_nursery() as outer:
        bridge_open = open_bridge(url, pool_size=2, application_name="jt-direct-reads-close")
        async with bridge_open as bridge:
            bridge.loop.set_exception_handler(lambda loop, context: errors.append(context))
            pid = await backend_pid(bridge)

            async def long_statement() -> None:
                try:
                    await bridge.run(
                        lambda conn: conn.execute("SELECT pg_sleep(30)"), what="a long statement"
                    )
                except DriverError:
                    ended.append("lost")

            outer.start_soon(long_statement)
            await _until_sleeping(admin, pid)
        # The bridge is closed: its operation ended with it, not after its 30 s.
    assert ended == ["lost"]
    assert not errors, errors


async def test_asyncpgs_own_timeout_holds_on_an_operations_second_statement(
    url: str, pg_schema: str
) -> None:
    # asyncpg's done callback for the first reply cancels the statement timer it finds. Run on
    # the loop after this task had moved on, it found the SECOND statement's timer and
    # cancelled that: the statement below ran its full 5 s instead of timing out.
    async with own_schema(url, pg_schema, pool_size=1) as driver:

        async def two(conn: Any) -> None:
            await conn.execute("SELECT 1")
            await conn.execute("SELECT pg_sleep(5)", timeout=0.3)

        with pytest.raises(DriverError):
            await driver.bridge.run(two, what="two statements")
        assert await driver.get("no-such-job") is None

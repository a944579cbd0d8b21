# The PostgreSQL driver's connection pool with stand-in connections (no server): how a slot is
# taken and given back around cancels. Apart from the driver's tests because none needs a server.
from __future__ import annotations

import trio
import trio.testing

from jobs_trio.drivers._postgres_pool import Pool


class StandIn:
    """The three things the pool asks of a connection."""

    def __init__(self) -> None:
        self.closed = False

    def is_closed(self) -> bool:
        return self.closed

    def is_in_transaction(self) -> bool:
        return False

    def terminate(self) -> None:
        self.closed = True


async def test_a_waiter_cancelled_once_handed_a_slot_gives_it_back_unused() -> None:
    opened: list[StandIn] = []

    async def connect() -> StandIn:
        opened.append(StandIn())
        return opened[-1]

    pool = Pool(connect, 1)
    used: list[str] = []
    waiter_scope = trio.CancelScope()

    async def waiter() -> None:
        with waiter_scope:
            async with pool.checkout():
                used.append("waiter")

    async with trio.open_nursery() as nursery:
        async with pool.checkout():
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()  # the waiter waits for the one slot
        # Released: the slot is handed to the waiter, which has not run yet; cancelled now,
        # it must not use the slot (nor open a connection or send a statement).
        waiter_scope.cancel()
    assert used == []
    assert waiter_scope.cancelled_caught
    assert len(opened) == 1
    async with pool.checkout():  # the slot came back: this does not wait
        pass
    assert len(opened) == 1


async def test_a_cancelled_caller_takes_no_free_slot() -> None:
    async def connect() -> StandIn:
        raise AssertionError("a cancelled caller opened a connection")

    pool = Pool(connect, 1)
    with trio.CancelScope() as scope:
        scope.cancel()
        async with pool.checkout():
            raise AssertionError("a cancelled caller got a connection")
    assert scope.cancelled_caught


async def test_a_connection_whose_operation_was_cancelled_is_never_handed_on() -> None:
    # Issue 32: under pg_terminate_backend chaos a connection whose operation a cancel cut
    # short went back to the pool, and the next operation on it failed "another operation is
    # in progress". An operation that answered, even with an error, keeps its connection.
    opened: list[StandIn] = []

    async def connect() -> StandIn:
        opened.append(StandIn())
        return opened[-1]

    pool = Pool(connect, 1)
    with trio.CancelScope() as scope:
        async with pool.checkout():
            scope.cancel()
            await trio.sleep_forever()  # the operation, in flight
    assert opened[0].closed
    try:
        async with pool.checkout():
            raise ValueError("the server refused the statement")
    except ValueError:
        pass
    assert len(opened) == 2 and not opened[1].closed
    async with pool.checkout() as conn:
        assert conn is opened[1]

# A TCP front for the test PostgreSQL that can go down: every connection through it cut at once
# and new ones refused, then back. Apart because stopping the shared test server would take down
# every other test's database with it; to the workers behind it, this is the server stopping.
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import trio


class OutageFront:
    """Forwards ``host:port`` on a port of its own (``url``) until ``down()``; ``up()`` again."""

    def __init__(self, url: str, port: int) -> None:
        parts = urlsplit(url)
        self.url = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}"))
        self._up = True
        self._links: set[trio.CancelScope] = set()

    def down(self) -> None:
        """Cut every connection through the front, and refuse new ones until ``up()``."""
        self._up = False
        for link in list(self._links):
            link.cancel()

    def up(self) -> None:
        self._up = True

    async def _serve(self, client: trio.SocketStream, host: str, port: int) -> None:
        async with client:
            if not self._up:
                return  # refused: closed at once, as a stopped server's port would be
            with trio.CancelScope() as link:
                self._links.add(link)
                try:
                    server = await trio.open_tcp_stream(host, port)
                    async with server, trio.open_nursery() as pumps:
                        pumps.start_soon(_pump, client, server)
                        pumps.start_soon(_pump, server, client)
                finally:
                    self._links.discard(link)


async def _pump(source: trio.abc.ReceiveStream, sink: trio.abc.SendStream) -> None:
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        async for chunk in source:
            await sink.send_all(chunk)


@contextlib.asynccontextmanager
async def outage_front(url: str) -> AsyncIterator[OutageFront]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5432
    async with trio.open_nursery() as nursery:
        [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
        front = OutageFront(url, listener.socket.getsockname()[1])

        async def serve(client: trio.SocketStream) -> None:
            await front._serve(client, host, port)

        nursery.start_soon(trio.serve_listeners, serve, [listener])
        try:
            yield front
        finally:
            nursery.cancel_scope.cancel()

# A TLS front for the test server: PostgreSQL's SSLRequest answered and TLS ended here, the
# plain protocol passed on. Apart because the test server has no certificate of its own, and
# TLS connections take other paths in the driver (the asyncio loop reads them, not our tasks).
from __future__ import annotations

import contextlib
import functools
import ssl
import struct
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import attrs
import trio

# PostgreSQL's request codes in the first message of a connection (protocol.html).
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104


@attrs.define
class Front:
    url: str  # the same server and database, through TLS (sslmode=require)
    tls: int = 0  # connections that completed a TLS handshake
    plain: int = 0  # connections that tried to start without TLS: refused


async def _receive_exactly(stream: trio.abc.ReceiveStream, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = await stream.receive_some(n - len(data))
        if not chunk:
            raise trio.BrokenResourceError("closed before its first message")
        data += chunk
    return data


async def _pump(source: trio.abc.ReceiveStream, sink: trio.abc.Stream) -> None:
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        async for chunk in source:
            await sink.send_all(chunk)
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await sink.aclose()


@contextlib.asynccontextmanager
async def tls_front(url: str) -> AsyncIterator[Front]:
    """Serve ``url``'s server through TLS on a port of its own while the block runs. A client
    that does not ask for TLS is refused (counted in ``plain``): nothing passes in the clear."""
    import trustme

    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5432
    authority = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    front = Front(url="")

    async def serve(client: trio.SocketStream) -> None:
        async with client:
            while True:
                _length, code = struct.unpack("!ii", await _receive_exactly(client, 8))
                if code == GSSENC_REQUEST:
                    await client.send_all(b"N")  # no GSS encryption here: the client goes on
                    continue
                if code != SSL_REQUEST:
                    front.plain += 1
                    return
                break
            await client.send_all(b"S")
            secured = trio.SSLStream(client, context, server_side=True)
            await secured.do_handshake()
            front.tls += 1
            async with (
                await trio.open_tcp_stream(host, port) as server,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(_pump, secured, server)
                nursery.start_soon(_pump, server, secured)

    async def serve_quietly(client: trio.SocketStream) -> None:
        # A client gone mid-handshake (a killed process) must not end the front for the others.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await serve(client)

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(
            functools.partial(trio.serve_tcp, serve_quietly, 0, host="127.0.0.1")
        )
        netloc = f"{parts.username or 'postgres'}@127.0.0.1:{listener.socket.getsockname()[1]}"
        query = parts.query + ("&" if parts.query else "") + "sslmode=require"
        front.url = urlunsplit((parts.scheme, netloc, parts.path, query, ""))
        yield front
        nursery.cancel_scope.cancel()

# `/metrics` for Prometheus, served from a Trio task: prometheus-client's exposition over a
# minimal HTTP/1.1 responder. Apart from metrics.py (what is counted) because serving is
# optional, and because prometheus-client's own server runs in a hidden thread.
from __future__ import annotations

import functools
import logging

import trio
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

from .errors import cannot_listen
from .logs import log_event

# A scrape request is one short line and a few headers; anything larger is not Prometheus.
MAX_REQUEST_BYTES = 16 * 1024
# A client that connects and sends nothing must not hold a connection (and its task) forever.
REQUEST_SECONDS = 10.0


async def serve_metrics(
    port: int,
    *,
    host: str = "127.0.0.1",
    registry: CollectorRegistry = REGISTRY,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``GET /metrics`` on ``host:port`` until cancelled; ``task_status.started`` answers
    the port it bound (``port=0`` picks a free one). Start it in a nursery of yours:
    ``port = await nursery.start(functools.partial(serve_metrics, 9108))``.

    ``host`` defaults to loopback; give ``"0.0.0.0"`` where Prometheus scrapes from another
    machine (a Kubernetes pod's port, a fleet). The worker's numbers are on
    prometheus-client's default ``registry``."""
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise cannot_listen(
            "the /metrics endpoint",
            host,
            port,
            exc,
            flag="--metrics-port",
            host_flag="--metrics-host",
        ) from exc
    bound = listeners[0].socket.getsockname()[1]
    log_event("jobs.metrics.serving", host=host, port=bound)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            trio.serve_listeners, functools.partial(_answer, registry=registry), listeners
        )
        task_status.started(bound)


async def _answer(stream: trio.SocketStream, *, registry: CollectorRegistry) -> None:
    async with stream:
        with trio.move_on_after(REQUEST_SECONDS):
            try:
                head = await _read_head(stream)
                response = _response(head, registry)
                await stream.send_all(response)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return  # the scraper went away: nothing to answer
            except Exception as exc:  # one bad request must not end the endpoint (or the worker)
                log_event("jobs.metrics.request-failed", logging.WARNING, error=repr(exc))


async def _read_head(stream: trio.SocketStream) -> bytes | None:
    """The request line and headers, or None when the client sent too much or stopped."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(4096)
        if not chunk:
            return None
        data += chunk
        if len(data) > MAX_REQUEST_BYTES:
            return None
    return data.split(b"\r\n\r\n", 1)[0]


def _response(head: bytes | None, registry: CollectorRegistry) -> bytes:
    if head is None:
        return _http(400, b"text/plain", b"bad request\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        return _http(400, b"text/plain", b"bad request\n")
    method, target, _ = parts
    if method not in ("GET", "HEAD"):
        return _http(405, b"text/plain", b"only GET and HEAD\n")
    if target.split("?", 1)[0] != "/metrics":
        return _http(404, b"text/plain", b"not found: metrics are at /metrics\n")
    headers = dict(
        (name.strip().lower(), value.strip())
        for name, _, value in (line.partition(":") for line in lines[1:])
    )
    # Prometheus asks for OpenMetrics when it can take it; choose_encoder answers in kind.
    encoder, content_type = choose_encoder(headers.get("accept", ""))
    body = encoder(registry)
    return _http(200, content_type.encode(), b"" if method == "HEAD" else body, len(body))


_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed"}


def _http(status: int, content_type: bytes, body: bytes, length: int | None = None) -> bytes:
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
        % (status, _REASONS[status], content_type, len(body) if length is None else length)
    ) + body

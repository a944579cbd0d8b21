# The dashboard as an ASGI application (Starlette on anyio, so it runs on Trio): routes, the
# status of every answer, and the security headers. Apart from views.py (what a page holds)
# and serve.py (opening a database and a socket), so an application can mount it on its own.
from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .._core import boundary as boundary
from .._core.errors import (
    ConfigError,
    DriverError,
    InvalidArgument,
    InvalidTransition,
    JobNotFound,
    JobsError,
)
from .._core.records import JobState
from .._jobs.registry import Registry
from ..drivers._rules import ATTEMPT_HISTORY
from ..drivers.contract import Driver
from . import views as views
from .cross_site import COOKIE, FORM_FIELD, LOOPBACK_HOSTS, CrossSiteGuard
from .templating import environment, url_part

# No script runs on any page (there is none to run), so even a value that escaped escaping
# could not execute; forms post only back here, and no other site may frame the pages
# (clickjacking an action button).
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    # Same-origin POSTs keep their Referer: the fallback origin check for browsers that send
    # no Origin header.
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}

FORM_BYTES = 4096
# How often the overview and a job's page reload themselves (seconds; 0: never).
REFRESH_SECONDS = 5.0

Handler = Callable[[Request], Awaitable[Response]]


def dashboard_app(
    driver: Driver,
    *,
    actions: bool = False,
    allowed_hosts: Iterable[str] = LOOPBACK_HOSTS,
    title: str = "jobs_trio",
    refresh: float = REFRESH_SECONDS,
    registry: Registry | None = None,
) -> ASGIApp:
    """The dashboard on an open ``driver``, as an ASGI app to serve or mount
    (``Mount("/jobs", app=dashboard_app(driver))``).

    ``actions=False`` (the default) answers every retry or cancel with 403: the pages only
    read. Open the driver read-only too when you mount it (SQLite: ``read_only=True``;
    PostgreSQL: add ``?default_transaction_read_only=on`` to the URL). ``allowed_hosts`` are
    the Host names it answers to (``"*"`` for any): requests naming another host get 400,
    which is what stops a DNS-rebinding page from reading it.

    The overview and a job's page reload themselves every ``refresh`` seconds (0: never), with
    no script: an HTML meta refresh, which ``?refresh=0`` pauses. ``registry`` (the one your
    workers run) adds each cron task's schedule and next fire to the overview."""
    if not (isinstance(refresh, int | float) and 0 <= refresh <= 3600):
        raise ConfigError(f"refresh={refresh!r}", fix="give seconds from 0 (never) to 3600")
    dashboard = _Dashboard(
        driver, actions, CrossSiteGuard(allowed_hosts), title, float(refresh), registry
    )
    app = Starlette(
        routes=[
            Route("/", dashboard.handler(dashboard.queues)),
            Route("/jobs", dashboard.handler(dashboard.jobs)),
            Route(
                "/jobs/{job_id:path}/retry", dashboard.handler(dashboard.retry), methods=["POST"]
            ),
            Route(
                "/jobs/{job_id:path}/cancel", dashboard.handler(dashboard.cancel), methods=["POST"]
            ),
            Route("/jobs/{job_id:path}", dashboard.handler(dashboard.job)),
        ]
    )
    return _HostGuard(app, dashboard.guard)


class _HostGuard:
    """Answers 400 to a request whose Host is not one the dashboard was told it is called."""

    def __init__(self, app: ASGIApp, guard: CrossSiteGuard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            host = headers.get(b"host", b"").decode("latin-1")
            if not self.guard.host_allowed(host):
                response = PlainTextResponse(
                    "this dashboard does not answer to that host name"
                    " (start it with --allowed-host NAME to add one)",
                    status_code=400,
                    headers=SECURITY_HEADERS,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _Dashboard:
    def __init__(
        self,
        driver: Driver,
        actions: bool,
        guard: CrossSiteGuard,
        title: str,
        refresh: float,
        registry: Registry | None,
    ) -> None:
        self.driver = driver
        self.actions = actions
        self.guard = guard
        self.title = title
        self.refresh = refresh
        self.registry = registry
        self.templates = environment()

    def handler(self, page: Handler) -> Handler:
        """Every page's errors as pages: a bad filter is 400, an unknown job 404, a refused
        transition 409, an unreachable database 503 — each with its cause and fix, escaped."""

        async def handle(request: Request) -> Response:
            try:
                return await page(request)
            except InvalidArgument as exc:
                return self.error(request, 400, exc)
            except JobNotFound as exc:
                return self.error(request, 404, exc)
            except InvalidTransition as exc:
                return self.error(request, 409, exc)
            except DriverError as exc:
                return self.error(request, 503, exc)

        return handle

    # Pages.

    async def queues(self, request: Request) -> Response:
        query = dict(request.query_params)
        views.check_filter_text(query)
        prefix = query.get("queue") or None
        now = self.driver.now()
        return self.render(
            request,
            "queues.html",
            refresh=self._refresh(query),
            page=await views.overview(
                self.driver, now, queue_prefix=prefix, registry=self.registry
            ),
            prefix=prefix or "",
            max_rows=views.MAX_QUEUE_ROWS,
            minutes=views.CHART_MINUTES,
            now=now,
        )

    async def jobs(self, request: Request) -> Response:
        wanted = views.JobFilter.parse(dict(request.query_params))
        if wanted.queue is not None:
            boundary.check_key(wanted.queue, argument="queue")
        page = await views.job_page(self.driver, wanted)

        def link(page_number: int) -> str:
            query = {
                "state": wanted.state.value if wanted.state else "",
                "queue": wanted.queue or "",
                "name": wanted.name or "",
                "page": str(page_number),
            }
            return "?" + urlencode({k: v for k, v in query.items() if v})

        return self.render(
            request,
            "jobs.html",
            page=page,
            wanted=wanted,
            states=[s.value for s in JobState],
            previous=link(wanted.page - 1) if wanted.page > 1 else None,
            next=link(wanted.page + 1) if page.has_next else None,
            scan_limit=views.SCAN_LIMIT,
            now=self.driver.now(),
        )

    async def job(self, request: Request) -> Response:
        job_id = self._job_id(request)
        detail = await views.job_detail(self.driver, job_id)
        if detail is None:
            raise JobNotFound(f"no job with id {job_id!r}", fix="check the id in the job list")
        refresh = self._refresh(dict(request.query_params))
        return self.render(
            request, "job.html", detail=detail, now=self.driver.now(), refresh=refresh
        )

    async def retry(self, request: Request) -> Response:
        return await self._act(request, self.driver.retry)

    async def cancel(self, request: Request) -> Response:
        return await self._act(request, self.driver.cancel)

    async def _act(self, request: Request, action: Callable[[str], Awaitable[Any]]) -> Response:
        if not self.actions:
            return self.error(
                request,
                403,
                JobsError(
                    "actions are off: this dashboard only reads",
                    fix="start it with `jobs-trio dashboard --actions` to retry and cancel",
                    code="X_ACTIONS_OFF",
                ),
            )
        token = (await _form(request)).get(FORM_FIELD)
        refusal = self.guard.check_post(
            host=request.headers.get("host"),
            origin=request.headers.get("origin"),
            referer=request.headers.get("referer"),
            nonce=request.cookies.get(COOKIE),
            token=token,
        )
        if refusal is not None:
            return self.error(
                request,
                refusal.status,
                JobsError(refusal.reason, fix="use the dashboard's own page", code="X_CROSS_SITE"),
            )
        job_id = self._job_id(request)
        await action(job_id)
        return RedirectResponse(
            f"{self._base(request)}/jobs/{_quote(job_id)}",
            status_code=303,
            headers=SECURITY_HEADERS,
        )

    # Rendering.

    def _refresh(self, query: Mapping[str, str]) -> float:
        """This page's reload period: the dashboard's, or 0 where the page was paused."""
        return 0.0 if query.get("refresh") == "0" else self.refresh

    def _job_id(self, request: Request) -> str:
        return boundary.check_key(request.path_params["job_id"], argument="job id")

    @staticmethod
    def _base(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    def render(self, request: Request, template: str, status: int = 200, **values: Any) -> Response:
        nonce = request.cookies.get(COOKIE) if self.actions else None
        fresh = self.actions and not nonce
        if fresh:
            nonce = self.guard.new_nonce()
        # A page that reloads itself has a "pause" link, and a paused one "resume"; both keep
        # the page's other query parameters (a filter).
        live_page = "refresh" in values
        values.setdefault("refresh", 0.0)
        # Query-only links ("?queue=x&refresh=0"): the same page, wherever it is mounted.
        kept = [(k, v) for k, v in request.query_params.multi_items() if k != "refresh"]
        html = self.templates.get_template(template).render(
            base=self._base(request),
            live_page=live_page and self.refresh > 0,
            pause_href=f"?{urlencode([*kept, ('refresh', '0')])}",
            resume_href=f"?{urlencode(kept)}",
            history=ATTEMPT_HISTORY,
            title=self.title,
            actions=self.actions,
            csrf_field=FORM_FIELD,
            csrf_token=self.guard.token_for(nonce) if nonce else "",
            quote=_quote,
            **values,
        )
        response = HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
        if fresh and nonce:
            response.set_cookie(
                COOKIE,
                nonce,
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
                path=self._base(request) or "/",
            )
        return response

    def error(self, request: Request, status: int, error: JobsError) -> Response:
        return self.render(request, "error.html", status=status, error=error)


async def _form(request: Request) -> dict[str, str]:
    """An action's urlencoded form (one hidden field), read up to FORM_BYTES. Parsed here:
    Starlette's own form parser needs python-multipart, a dependency for one field."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_BYTES:
            return {}  # not one of our forms: the token check then refuses it
    return dict(parse_qsl(body.decode("utf-8", "replace")))


# A job id as one path segment: a planted id holding '/', '?' or '#' stays one id.
_quote = url_part

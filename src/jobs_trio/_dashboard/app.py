# The dashboard as an ASGI application (Starlette on anyio, so it runs on Trio): routes, the
# status of every answer, and the security headers. Apart from views.py (what a page holds)
# and serve.py (opening a database and a socket), so an application can mount it on its own.
from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
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
from .._core.operator_transitions import BULKS, DELETE, Bulk
from .._core.records import JobState
from .._jobs.pausing import pause_queue
from .._jobs.registry import Registry
from ..drivers._rules import ATTEMPT_HISTORY
from ..drivers.contract import Driver
from . import views as views
from .cross_site import COOKIE, FORM_FIELD, LOOPBACK_HOSTS, CrossSiteGuard
from .templating import environment, url_part

# The one script is the dashboard's own (live.js, from this origin): no inline script runs, so a
# value that escaped escaping still could not execute, and the script reads only this origin.
# Forms post only back here, and no other site may frame the pages (clickjacking a button).
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; connect-src 'self';"
    " style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self';"
    " frame-ancestors 'none'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    # Same-origin POSTs keep their Referer: the fallback origin check for browsers that send
    # no Origin header.
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}

# An action's form: a token, and for a bulk action up to a page of job ids (50 of 27 hex digits).
FORM_BYTES = 16384
# The script that updates a page in place (static/live.js): read once, served from here.
LIVE_SCRIPT = (Path(__file__).with_name("static") / "live.js").read_bytes()
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

    ``actions=False`` (the default) answers every action (retry, cancel, delete, run now, bulk,
    pause and resume of a queue) with 403: the pages only read. Open the driver read-only too
    when you mount it (SQLite: ``read_only=True``; PostgreSQL: add
    ``?default_transaction_read_only=on`` to the URL). ``allowed_hosts`` are
    the Host names it answers to (``"*"`` for any): requests naming another host get 400,
    which is what stops a DNS-rebinding page from reading it.

    The overview, the job list and a job's page update themselves every ``refresh`` seconds (0:
    never; ``?refresh=0`` pauses one page): the dashboard's script swaps in each part of the
    page from a fresh copy, so a filter being typed and the jobs ticked stay as they are (a
    browser without scripts reloads the page instead). ``registry`` (the one your workers run)
    adds each cron task's schedule and next fire to the overview."""
    if not (isinstance(refresh, int | float) and 0 <= refresh <= 3600):
        raise ConfigError(f"refresh={refresh!r}", fix="give seconds from 0 (never) to 3600")
    dashboard = _Dashboard(
        driver, actions, CrossSiteGuard(allowed_hosts), title, float(refresh), registry
    )
    app = Starlette(
        routes=[
            Route("/", dashboard.handler(dashboard.queues)),
            Route("/live.js", dashboard.script),
            Route(
                "/queues/{queue:path}/pause", dashboard.handler(dashboard.pause), methods=["POST"]
            ),
            Route(
                "/queues/{queue:path}/resume",
                dashboard.handler(dashboard.resume),
                methods=["POST"],
            ),
            Route("/jobs", dashboard.handler(dashboard.jobs)),
            # Before the job's own routes: a job id is any text, "bulk" included (a GET of
            # /jobs/bulk is that job's page: this route takes POSTs only).
            Route("/jobs/bulk", dashboard.handler(dashboard.bulk), methods=["POST"]),
            *(
                Route(
                    f"/jobs/{{job_id:path}}/{bulk.verb}",
                    dashboard.handler(functools.partial(dashboard.act_on_one, bulk)),
                    methods=["POST"],
                )
                for bulk in BULKS
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
        query = dict(request.query_params)
        wanted = views.JobFilter.parse(query)
        if wanted.queue is not None:
            boundary.check_key(wanted.queue, argument="queue")
        page = await views.job_page(self.driver, wanted)

        def link(page_number: int) -> str:
            return "?" + urlencode([*_filter_query(wanted), ("page", str(page_number))])

        return self.render(
            request,
            "jobs.html",
            refresh=self._refresh(query),
            page=page,
            wanted=wanted,
            filter_fields=_filter_query(wanted),
            notice=_notice(query),
            bulks=BULKS,
            states=[s.value for s in JobState],
            previous=link(wanted.page - 1) if wanted.page > 1 else None,
            next=link(wanted.page + 1) if page.has_next else None,
            scan_limit=views.SCAN_LIMIT,
            bulk_limit=views.BULK_LIMIT,
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

    async def script(self, request: Request) -> Response:
        headers = {**SECURITY_HEADERS, "cache-control": "no-cache"}
        return Response(LIVE_SCRIPT, media_type="text/javascript", headers=headers)

    # Actions: each a POST from one of the dashboard's own pages (actions on, the cross-site
    # checks passed), answered with a redirect to the page that shows what it did.

    async def act_on_one(self, bulk: Bulk, request: Request) -> Response:
        form = await self._posted(request)
        if isinstance(form, Response):
            return form
        job_id = self._job_id(request)
        await bulk.act(self.driver, job_id)
        if bulk is DELETE:  # its page is gone: the list says what happened
            return self._redirect(request, "/jobs?" + urlencode({"done": bulk.verb, "n": "1"}))
        return self._redirect(request, f"/jobs/{_quote(job_id)}")

    async def bulk(self, request: Request) -> Response:
        """A bulk action from the job list, by the button pressed: ``retry`` on the jobs ticked
        (``job`` fields), ``retry matching`` on every job the list's filter matches, BULK_LIMIT
        at most. A job that changed since it was listed is skipped and counted, as the CLI's."""
        form = await self._posted(request)
        if isinstance(form, Response):
            return form
        fields = dict(form)
        # The button pressed: "retry" (the ticked jobs) or "retry matching" (the filter's).
        verb, _, scope = fields.get("action", "").partition(" ")
        bulk = next((b for b in BULKS if b.verb == verb), None)
        if bulk is None or scope not in ("", "matching"):
            raise InvalidArgument(
                "action", f"{fields.get('action')!r} is not an action", fix="use the page's buttons"
            )
        wanted = views.JobFilter.parse({k: fields.get(k, "") for k in ("state", "queue", "name")})
        if scope == "matching":
            ids = [r.id for r in await views.bulk_targets(self.driver, wanted, bulk)]
        else:
            ids = list(dict.fromkeys(v for k, v in form if k == "job"))
            for job_id in ids:
                boundary.check_key(job_id, argument="job id")
        done = skipped = 0
        for job_id in ids:
            try:
                await bulk.act(self.driver, job_id)
            except (InvalidTransition, JobNotFound):
                skipped += 1  # changed (or pruned) since it was listed
            else:
                done += 1
        result = {"done": bulk.verb, "n": str(done), "skipped": str(skipped)}
        return self._redirect(
            request, "/jobs?" + urlencode([*_filter_query(wanted), *result.items()])
        )

    async def pause(self, request: Request) -> Response:
        form = await self._posted(request)
        if isinstance(form, Response):
            return form
        # Answered once the workers holding jobs of it heard (CONFIRM_WITHIN at most): the
        # overview it redirects to then shows it paused everywhere, or who has not heard.
        await pause_queue(self.driver, self._queue(request), by="the dashboard")
        return self._redirect(request, "/")

    async def resume(self, request: Request) -> Response:
        form = await self._posted(request)
        if isinstance(form, Response):
            return form
        await self.driver.resume_queue(self._queue(request))
        return self._redirect(request, "/")

    async def _posted(self, request: Request) -> Sequence[tuple[str, str]] | Response:
        """The POST's form, or the refusal to answer: actions off (403), or a request that did
        not come from this dashboard's own page (403, cross_site.py)."""
        if not self.actions:
            return self.error(
                request,
                403,
                JobsError(
                    "actions are off: this dashboard only reads",
                    fix="start it with `jobs-trio dashboard --actions` to act on jobs and queues",
                    code="X_ACTIONS_OFF",
                ),
            )
        form = await _form(request)
        refusal = self.guard.check_post(
            host=request.headers.get("host"),
            origin=request.headers.get("origin"),
            referer=request.headers.get("referer"),
            nonce=request.cookies.get(COOKIE),
            token=dict(form).get(FORM_FIELD),
        )
        if refusal is not None:
            return self.error(
                request,
                refusal.status,
                JobsError(refusal.reason, fix="use the dashboard's own page", code="X_CROSS_SITE"),
            )
        return form

    def _redirect(self, request: Request, path: str) -> Response:
        return RedirectResponse(
            f"{self._base(request)}{path}", status_code=303, headers=SECURITY_HEADERS
        )

    # Rendering.

    def _refresh(self, query: Mapping[str, str]) -> float:
        """This page's reload period: the dashboard's, or 0 where the page was paused."""
        return 0.0 if query.get("refresh") == "0" else self.refresh

    def _job_id(self, request: Request) -> str:
        return boundary.check_key(request.path_params["job_id"], argument="job id")

    def _queue(self, request: Request) -> str:
        return boundary.check_name(request.path_params["queue"], argument="queue")

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
        kept = [
            (k, v)
            for k, v in request.query_params.multi_items()
            if k not in ("refresh", "done", "n", "skipped")  # a notice is said once
        ]
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


async def _form(request: Request) -> list[tuple[str, str]]:
    """An action's urlencoded form (a token, and a bulk action's fields), read up to
    FORM_BYTES. Parsed here: Starlette's own form parser needs python-multipart, a dependency
    for a few fields."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_BYTES:
            return []  # not one of our forms: the token check then refuses it
    return parse_qsl(body.decode("utf-8", "replace"))


def _filter_query(wanted: views.JobFilter) -> list[tuple[str, str]]:
    """The job list's filter as query fields (the empty ones left out)."""
    fields = [
        ("state", wanted.state.value if wanted.state else ""),
        ("queue", wanted.queue or ""),
        ("name", wanted.name or ""),
    ]
    return [(k, v) for k, v in fields if v]


def _notice(query: Mapping[str, str]) -> str | None:
    """What the last action did, for the job list to say (``done``, ``n``, ``skipped`` from its
    redirect): only an action's own words and numbers, never text from the query."""
    bulk = next((b for b in BULKS if b.verb == query.get("done")), None)
    counts = [query.get(k, "0") for k in ("n", "skipped")]
    if bulk is None or not all(c.isdecimal() and len(c) < 7 for c in counts):
        return None
    done, skipped = (int(c) for c in counts)
    said = f"{bulk.done.capitalize()} {done} job{'s' * (done != 1)}"
    if skipped:
        said += f"; {skipped} skipped (changed since they were listed)"
    return said + "."


# A job id as one path segment: a planted id holding '/', '?' or '#' stays one id.
_quote = url_part

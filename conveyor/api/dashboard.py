"""``/admin/queues``: the dashboard, server-rendered HTML with a little vanilla JavaScript.

Pages: every queue with its counts (pause/resume, retry all failed); a
queue's jobs by state with paging, filtered by job type, and its busiest
fair-share groups; the declared budgets with their keys' use; one job (payload
with secrets redacted, attempts with their tracebacks, error, timings,
retry/delete); the worker processes; search by job id or key. Buttons
call the JSON routes of :mod:`conveyor.api.admin`. A browser signs in once
with the admin token in a form and gets a session (:mod:`conveyor.api.sessions`):
it expires, logout (a POST carrying the page's CSRF token) ends it, and
wrong tokens are throttled per client.

The pages' scripts are static files under ``/admin/static/`` (``static/``),
never inline, so the Content Security Policy can say ``script-src 'self'``:
``dashboard.js`` runs the buttons, ``live.js`` the live pages. A live page's
script asks the page's own URL again every few seconds with the
:data:`LIVE_HEADER`; the route then answers JSON with the page's ``live_*``
template blocks rendered (``{"regions": {id: html}, "follow": bool}``) and
the script swaps them in. ``follow`` false (a job that ended) stops the
polling.
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, quote, urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.types import Scope

from conveyor.api import sessions
from conveyor.api.auth import COOKIE, CSRF_HEADER, CSRF_VALUE, Access, check_access, configured_token, same_secret
from conveyor.api.charts import charts as draw_charts
from conveyor.api.deps import CursorQuery, NamePath, inspector
from conveyor.brokers.base import JOB_STATES
from conveyor.errors import InvalidQuery, JobNotFound, UnknownQueue
from conveyor.history import DEFAULT_WINDOW, WINDOWS
from conveyor.inspector import BULK_CHUNK, Inspector, QueueView
from conveyor.logs import log_error

router = APIRouter(prefix="/admin", include_in_schema=False)

#: Jobs per page of a queue's list.
PAGE_SIZE = 25

#: Groups a queue's page lists (the busiest); the rest are counted. The admin API lists up to MAX_GROUPS.
GROUPS_SHOWN = 20

#: Keys of each budget the Budgets page lists (the most used); the rest are counted.
BUDGET_KEYS_SHOWN = 10

#: Most pages back the dashboard remembers for its Previous link (the ``trail`` of earlier pages' cursors).
MAX_TRAIL = 200

#: Seconds between refreshes of a live page (counts, lists, workers, a job until it ends).
LIVE_SECONDS = 2

#: Header live.js sends to get a page's live regions as JSON instead of the page.
LIVE_HEADER = "X-Conveyor-Live"

_templates = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(["html"]),
)


def _datetime(ts: float | None) -> str:
    if not ts:
        return "–"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _ago(ts: float | None) -> str:
    return f"{_duration(max(0.0, time.time() - ts))} ago" if ts else "–"


def _amount(value: float) -> str:
    """A budget's weight: whole numbers as such (90000), others to two decimals."""
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


_templates.filters.update(datetime=_datetime, duration=_duration, ago=_ago, amount=_amount)
_templates.globals.update(csrf_header=CSRF_HEADER, csrf_value=CSRF_VALUE, states=JOB_STATES)


#: Where the dashboard's static files (its scripts) are served from.
STATIC_DIR = Path(__file__).with_name("static")
STATIC_PATH = "/admin/static"


class StaticAssets(StaticFiles):
    """The dashboard's scripts, revalidated on every load (``no-cache``) so an upgrade's pages never run old ones."""

    def file_response(
        self, full_path: str | os.PathLike[str], stat_result: os.stat_result, scope: Scope, status_code: int = 200
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers["Cache-Control"] = "no-cache"
        return response


def _page(
    name: str,
    status: int = 200,
    request: Request | None = None,
    headers: dict[str, str] | None = None,
    **context: Any,
) -> HTMLResponse:
    """A page; given the ``request``, its sign-out form carries the session's CSRF token."""
    cookie = request.cookies.get(COOKIE) if request is not None else None
    html = _templates.get_template(name).render(
        csrf_token=sessions.csrf_token(cookie) if cookie else "", static=STATIC_PATH, **context
    )
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store", **(headers or {})})


def _live_page(request: Request, name: str, *, follow: bool = True, **context: Any) -> Response:
    """The page, or (asked by live.js) its ``live_*`` blocks as JSON; ``follow`` false stops the refreshing."""
    context.update(live=LIVE_SECONDS if follow else None)
    if request.headers.get(LIVE_HEADER) != "1":
        return _page(name, request=request, **context)
    template = _templates.get_template(name)
    ctx = template.new_context(context)
    regions = {
        block[len("live_") :]: "".join(render(ctx))
        for block, render in template.blocks.items()
        if block.startswith("live_")
    }
    return JSONResponse({"regions": regions, "follow": follow}, headers={"Cache-Control": "no-store"})


def _charts(request: Request, inspect: Inspector, queue: str | None) -> dict[str, Any]:
    """The context of ``_charts.html``: the window asked for (``?window=1h|24h``; anything else is 1h) drawn.

    The links keep the page's other parameters. A store that cannot be read leaves the charts out
    (``charts`` empty) rather than failing the page: its counts show the outage already.
    """
    window = request.query_params.get("window", DEFAULT_WINDOW)
    if window not in WINDOWS:
        window = DEFAULT_WINDOW
    # The page's own filters go along, and only values the dashboard knows: no input is echoed back.
    kept = []
    if request.query_params.get("state") in JOB_STATES:
        kept.append(("state", request.query_params["state"]))
    if request.query_params.get("job") in inspect.app.job_types:
        kept.append(("job", request.query_params["job"]))
    links = [(name, f"{request.url.path}?{urlencode([*kept, ('window', name)])}") for name in WINDOWS]
    try:
        history = inspect.history(queue, window)
    except (UnknownQueue, InvalidQuery):
        raise
    except Exception as exc:
        log_error(f"chart history not read: {type(exc).__name__}: {exc}", queue=queue)
        return {"charts": [], "history": None, "chart_window": window, "chart_links": links}
    return {"charts": draw_charts(history), "history": history, "chart_window": window, "chart_links": links}


def _gate(request: Request) -> Response | None:
    """None when the browser may see the page; else the closed page or the sign-in form."""
    access = check_access(request)
    if access is Access.GRANTED:
        return None
    if access is Access.CLOSED:
        return _page("closed.html", 403, title="Closed")
    return _page("login.html", 401, title="Sign in", next=request.url.path, error=None)


def _client(request: Request) -> str:
    """Whom sign-in failures are counted against: the peer address (a proxy's X-Forwarded-For only when the
    peer is one of CONVEYOR_TRUSTED_PROXIES: uvicorn is configured so by ``conveyor api``)."""
    return request.client.host if request.client else "unknown"


@router.get("", include_in_schema=False)
def root() -> RedirectResponse:
    return RedirectResponse("/admin/queues", status_code=303)


@router.post("/login")
async def login(request: Request) -> Response:
    token = configured_token(request)
    if token is None:
        return _page("closed.html", 403, title="Closed")
    form = parse_qs((await request.body()).decode(errors="replace"))
    given = (form.get("token") or [""])[0]
    target = (form.get("next") or ["/admin/queues"])[0]
    if not target.startswith("/admin/") or target.startswith("/admin//") or "\\" in target:
        target = "/admin/queues"  # only ever back into the dashboard
    app, client = request.app.state.conveyor, _client(request)
    # The right token always signs in, however many wrong ones came from this address before (whoever
    # shares it, or claims to, can never lock the operator out). Past the throttle a wrong one answers
    # 429 and is no longer even recorded; the token is too long to find by guessing (see settings).
    if not same_secret(given, token):
        if await run_in_threadpool(sessions.throttled, app, client):
            window = int(app.settings.admin_login_window)
            return _page(
                "login.html",
                429,
                title="Sign in",
                next=target,
                headers={"Retry-After": str(window)},
                error="Too many wrong tokens from this address: try again in a minute.",
            )
        await run_in_threadpool(sessions.record_failure, app, client)
        return _page("login.html", 401, title="Sign in", next=target, error="That token is not the admin token.")
    cookie = await run_in_threadpool(sessions.open_session, app, client)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        COOKIE,
        cookie,
        httponly=True,
        samesite="strict",
        path="/",
        max_age=int(app.settings.admin_session_seconds),
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """End the session: the cookie stops working everywhere, copies included. Needs the page's CSRF token."""
    cookie = request.cookies.get(COOKIE)
    form = parse_qs((await request.body()).decode(errors="replace"))
    given = (form.get("csrf") or [""])[0]
    by_script = request.headers.get(CSRF_HEADER) == CSRF_VALUE
    if not cookie or not (by_script or same_secret(given, sessions.csrf_token(cookie))):
        return _page("missing.html", 403, title="Forbidden", message="Sign out from the dashboard's own button.")
    await run_in_threadpool(sessions.revoke, request.app.state.conveyor, cookie)
    response = RedirectResponse("/admin/queues", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


@router.get("/queues", response_class=HTMLResponse)
def queues(request: Request, inspect: Inspector = Depends(inspector)) -> Response:
    if (gate := _gate(request)) is not None:
        return gate
    return _live_page(
        request,
        "queues.html",
        title="Queues",
        queues=inspect.queues(),
        broker=inspect.app.settings.broker_name,
        config_warnings=inspect.config_warnings(),
        **_charts(request, inspect, None),
    )


@router.get("/queues/{queue}", response_class=HTMLResponse)
def queue(
    request: Request,
    queue: NamePath,
    state: Annotated[str, Query(max_length=20)] = "waiting",
    cursor: CursorQuery = None,
    job: Annotated[str | None, Query(max_length=200)] = None,
    trail: Annotated[str | None, Query(max_length=MAX_TRAIL * 11)] = None,
    inspect: Inspector = Depends(inspector),
) -> Response:
    if (gate := _gate(request)) is not None:
        return gate
    earlier = _trail(trail) if cursor else []
    if earlier is None:
        return _bad_cursor(request)
    if state not in JOB_STATES:
        return _page(
            "missing.html",
            400,
            request=request,
            title="Bad request",
            message=f"state is one of {', '.join(JOB_STATES)}",
        )
    job_names = sorted(t.name for t in inspect.app.job_types.values() if t.queue == queue)
    if job not in job_names:
        job = None  # an unknown job type filters nothing (and is not echoed)
    try:
        view = inspect.queue(queue)
        page = inspect.jobs(queue, state, limit=PAGE_SIZE, cursor=cursor, job=job)
        counts = _tab_counts(inspect, view, job)
        groups = inspect.groups(queue, limit=GROUPS_SHOWN)
    except UnknownQueue as exc:
        return _page("missing.html", 404, request=request, title="Not found", message=str(exc))
    except InvalidQuery:
        return _bad_cursor(request)
    return _live_page(
        request,
        "queue.html",
        title=f"Queue {queue}",
        queue=view,
        page=page,
        job_names=job_names,
        counts=counts,
        groups=groups,
        paging=_paging(earlier, cursor, page.next_cursor),
        bulk_chunk=BULK_CHUNK,
        **_charts(request, inspect, queue),
    )


def _bad_cursor(request: Request) -> Response:
    return _page(
        "missing.html",
        400,
        request=request,
        title="Bad request",
        message="cursor: not a page of this dashboard; start again from the queue's first page",
    )


def _trail(text: str | None) -> list[str] | None:
    """The cursors of the pages before this one (after the first), as ``trail`` holds them; None if malformed."""
    parts = [p for p in (text or "").split(".") if p]
    if len(parts) > MAX_TRAIL or not all(p.isascii() and p.isdigit() and len(p) <= 10 for p in parts):
        return None
    return parts


def _paging(earlier: list[str], cursor: str | None, next_cursor: str | None) -> dict[str, Any]:
    """Where this page is (``number``, 1 = first) and the query strings of the previous and next pages."""
    number = len(earlier) + 2 if cursor else 1
    prev: str | None = None
    if cursor:
        prev = f"&cursor={earlier[-1]}&trail={'.'.join(earlier[:-1])}" if earlier else ""
    following = None
    if next_cursor and len(earlier) < MAX_TRAIL:
        following = f"&cursor={next_cursor}&trail={'.'.join([*earlier, cursor] if cursor else [])}"
    return {"number": number, "prev": prev, "next": following}


def _tab_counts(inspect: Inspector, view: QueueView, job: str | None) -> dict[str, str]:
    """Each state tab's count: the queue's, or with a job-type filter that type's retained jobs (``N+`` when
    the count stopped at the scan's limit). Unfiltered, completed counts every completion ever."""
    if job is None:
        return {s: str(view.completed_total if s == "completed" else getattr(view, s)) for s in JOB_STATES}
    return {s: f"{n}+" if capped else str(n) for s, (n, capped) in inspect.job_counts(view.name, job).items()}


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job(request: Request, job_id: NamePath, inspect: Inspector = Depends(inspector)) -> Response:
    if (gate := _gate(request)) is not None:
        return gate
    try:
        view = inspect.job(job_id)
    except JobNotFound as exc:
        return _page("missing.html", 404, request=request, title="Not found", message=str(exc))
    # Followed until it ends; a failed or completed job changes only by an operator's click (which reloads).
    return _live_page(
        request,
        "job.html",
        follow=view.state in ("waiting", "delayed", "active"),
        title=f"Job {view.job}",
        job=view,
        payload_json=json.dumps(view.payload, indent=2, sort_keys=True, default=str),
    )


@router.get("/workers", response_class=HTMLResponse)
def workers(request: Request, inspect: Inspector = Depends(inspector)) -> Response:
    if (gate := _gate(request)) is not None:
        return gate
    return _live_page(
        request, "workers.html", title="Workers", workers=inspect.workers(), broker=inspect.app.settings.broker_name
    )


@router.get("/budgets", response_class=HTMLResponse)
def budgets(request: Request, inspect: Inspector = Depends(inspector)) -> Response:
    if (gate := _gate(request)) is not None:
        return gate
    return _live_page(request, "budgets.html", title="Budgets", budgets=inspect.budgets(keys=BUDGET_KEYS_SHOWN))


@router.get("/search", response_class=HTMLResponse)
def search(
    request: Request, q: Annotated[str, Query(max_length=1000)] = "", inspect: Inspector = Depends(inspector)
) -> Response:
    """A job id or key: straight to the job when one matches, else the matches or a not-found page."""
    if (gate := _gate(request)) is not None:
        return gate
    found = inspect.search(q)
    if len(found) == 1:
        return RedirectResponse(f"/admin/jobs/{quote(found[0].id, safe='')}", status_code=303)
    return _page("search.html", 200 if found else 404, request=request, title="Search", jobs=found)

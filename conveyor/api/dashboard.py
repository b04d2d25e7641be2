"""``/admin/queues``: the dashboard, server-rendered HTML with a little vanilla JavaScript.

Pages: every queue with its counts (pause/resume, retry all failed); a
queue's jobs by state with paging; one job (payload with secrets
redacted, attempts, error, timings, retry/delete). Buttons call the JSON
routes of :mod:`conveyor.api.admin`. A browser signs in once with the
admin token in a form and gets a session (:mod:`conveyor.api.sessions`):
it expires, logout (a POST carrying the page's CSRF token) ends it, and
wrong tokens are throttled per client. The pages' script is a static file
(``static/dashboard.js``, served under ``/admin/static/``) so the Content
Security Policy can forbid inline scripts.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import parse_qs

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from ..brokers.base import JOB_STATES
from ..errors import JobNotFound, UnknownQueue
from . import sessions
from .auth import COOKIE, CSRF_HEADER, CSRF_VALUE, Access, check_access, configured_token, same_secret
from .deps import CursorQuery, NamePath, inspector
from .inspector import Inspector

router = APIRouter(prefix="/admin", include_in_schema=False)

#: Jobs per page of a queue's list.
PAGE_SIZE = 25

#: Seconds between reloads of a job page while the job is still to finish.
JOB_REFRESH_SECONDS = 2

_templates = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(["html"]),
)


def _datetime(ts: float | None) -> str:
    if not ts:
        return "–"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


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


_templates.filters.update(datetime=_datetime, duration=_duration, ago=_ago)
_templates.globals.update(csrf_header=CSRF_HEADER, csrf_value=CSRF_VALUE, states=JOB_STATES)


#: Where the dashboard's static files (its script) are served from.
STATIC_DIR = Path(__file__).with_name("static")
STATIC_PATH = "/admin/static"


def _page(name: str, status: int = 200, request: Request | None = None, headers: dict | None = None,
          **context) -> HTMLResponse:
    """A page; given the ``request``, its sign-out form carries the session's CSRF token."""
    cookie = request.cookies.get(COOKIE) if request is not None else None
    html = _templates.get_template(name).render(csrf_token=sessions.csrf_token(cookie) if cookie else "",
                                                static=STATIC_PATH, **context)
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store", **(headers or {})})


def _gate(request: Request) -> Response | None:
    """None when the browser may see the page; else the closed page or the sign-in form."""
    access = check_access(request)
    if access is Access.GRANTED:
        return None
    if access is Access.CLOSED:
        return _page("closed.html", 403, title="Closed")
    return _page("login.html", 401, title="Sign in", next=request.url.path, error=None)


def _client(request: Request) -> str:
    """Whom sign-in failures are counted against: the peer address."""
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
    if await run_in_threadpool(sessions.throttled, app, client):
        window = int(app.settings.admin_login_window)
        return _page("login.html", 429, title="Sign in", next=target, headers={"Retry-After": str(window)},
                     error="Too many wrong tokens from this address: try again in a minute.")
    if not same_secret(given, token):
        await run_in_threadpool(sessions.record_failure, app, client)
        return _page("login.html", 401, title="Sign in", next=target, error="That token is not the admin token.")
    cookie = await run_in_threadpool(sessions.open_session, app, client)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(COOKIE, cookie, httponly=True, samesite="strict", path="/",
                        max_age=int(app.settings.admin_session_seconds), secure=request.url.scheme == "https")
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
    return _page("queues.html", request=request, title="Queues", queues=inspect.queues(), broker=inspect.app.settings.broker_name)


@router.get("/queues/{queue}", response_class=HTMLResponse)
def queue(request: Request, queue: NamePath, state: Annotated[str, Query(max_length=20)] = "waiting",
          cursor: CursorQuery = None,
          inspect: Inspector = Depends(inspector)) -> Response:
    if (gate := _gate(request)) is not None:
        return gate
    if state not in JOB_STATES:
        return _page("missing.html", 400, request=request, title="Bad request",
                     message=f"state is one of {', '.join(JOB_STATES)}")
    try:
        view = inspect.queue(queue)
        page = inspect.jobs(queue, state, limit=PAGE_SIZE, cursor=cursor)
    except UnknownQueue as exc:
        return _page("missing.html", 404, request=request, title="Not found", message=str(exc))
    except ValueError:
        return _page("missing.html", 400, request=request, title="Bad request",
                     message="cursor: not a page of this dashboard; start again from the queue's first page")
    return _page("queue.html", request=request, title=f"Queue {queue}", queue=view, page=page)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job(request: Request, job_id: NamePath, inspect: Inspector = Depends(inspector)) -> Response:
    if (gate := _gate(request)) is not None:
        return gate
    try:
        view = inspect.job(job_id)
    except JobNotFound as exc:
        return _page("missing.html", 404, request=request, title="Not found", message=str(exc))
    refresh = JOB_REFRESH_SECONDS if view.state in ("waiting", "delayed", "active") else None
    return _page("job.html", request=request, title=f"Job {view.job}", job=view, refresh=refresh,
                 payload_json=json.dumps(view.payload, indent=2, sort_keys=True, default=str))

"""``/admin/queues``: the dashboard, server-rendered HTML with a little vanilla JavaScript.

Pages: every queue with its counts (pause/resume, retry all failed); a
queue's jobs by state with paging; one job (payload with secrets
redacted, attempts, error, timings, retry/delete). Buttons call the JSON
routes of :mod:`conveyor.api.admin`. A browser signs in once with the
admin token in a form; see :mod:`conveyor.api.auth`.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from ..brokers.base import JOB_STATES
from ..errors import JobNotFound, UnknownQueue
from .auth import COOKIE, CSRF_HEADER, CSRF_VALUE, Access, check_access, configured_token, same_secret, session_value
from .deps import inspector
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


def _page(name: str, status: int = 200, **context) -> HTMLResponse:
    html = _templates.get_template(name).render(**context)
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})


def _gate(request: Request) -> Response | None:
    """None when the browser may see the page; else the closed page or the sign-in form."""
    access = check_access(request)
    if access is Access.GRANTED:
        return None
    if access is Access.CLOSED:
        return _page("closed.html", 403, title="Closed")
    return _page("login.html", 401, title="Sign in", next=request.url.path, error=None)


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
    if not target.startswith("/admin/") or target.startswith("/admin//"):
        target = "/admin/queues"  # only ever back into the dashboard
    if not same_secret(given, token):
        return _page("login.html", 401, title="Sign in", next=target, error="That token is not the admin token.")
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(COOKIE, session_value(token), httponly=True, samesite="strict", path="/",
                        secure=request.url.scheme == "https")
    return response


@router.post("/logout")
def logout() -> Response:
    response = RedirectResponse("/admin/queues", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


@router.get("/queues", response_class=HTMLResponse)
def queues(request: Request, inspect: Inspector = Depends(inspector)) -> Response:
    if (gate := _gate(request)) is not None:
        return gate
    return _page("queues.html", title="Queues", queues=inspect.queues(), broker=inspect.app.settings.broker_name,
                 config_warnings=inspect.config_warnings())


@router.get("/queues/{queue}", response_class=HTMLResponse)
def queue(request: Request, queue: str, state: str = "waiting", cursor: str | None = None,
          inspect: Inspector = Depends(inspector)) -> Response:
    if (gate := _gate(request)) is not None:
        return gate
    if state not in JOB_STATES:
        state = "waiting"
    try:
        view = inspect.queue(queue)
        page = inspect.jobs(queue, state, limit=PAGE_SIZE, cursor=cursor)
    except UnknownQueue as exc:
        return _page("missing.html", 404, title="Not found", message=str(exc))
    except ValueError:
        page = inspect.jobs(queue, state, limit=PAGE_SIZE)
    return _page("queue.html", title=f"Queue {queue}", queue=view, page=page)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job(request: Request, job_id: str, inspect: Inspector = Depends(inspector)) -> Response:
    if (gate := _gate(request)) is not None:
        return gate
    try:
        view = inspect.job(job_id)
    except JobNotFound as exc:
        return _page("missing.html", 404, title="Not found", message=str(exc))
    refresh = JOB_REFRESH_SECONDS if view.state in ("waiting", "delayed", "active") else None
    return _page("job.html", title=f"Job {view.job}", job=view, refresh=refresh,
                 payload_json=json.dumps(view.payload, indent=2, sort_keys=True, default=str))

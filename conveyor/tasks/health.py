"""A worker supervisor's health endpoint (``conveyor worker --health-port``), for Kubernetes' probes.

``/livez``: the supervisor's loop is turning (a liveness probe: restart the pod only when it is stuck).
``/healthz``: that, and every worker process is running, the worker is not draining, and the broker
answers (a readiness or startup probe). A refusal says which in a few words, never an error's text
(a connection error can name the server's URL).
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from conveyor.app import App

#: How long the supervisor's loop may go without a turn before /livez fails (it turns every 0.2 s).
STALE_AFTER = 30.0


def broker_check(app: App) -> Callable[[], None]:
    """A call that raises unless the App's broker server answers: a Redis PING, or a Postgres connection."""
    settings = app.settings
    if app.capabilities.store == "redis" and settings.redis_url:
        from conveyor.redis_client import client

        redis = client(settings.redis_url, settings)

        def ping() -> None:
            redis.ping()

        return ping
    url = app.database_url

    def postgres() -> None:
        from conveyor.db import connect

        with connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")

    return postgres


class Health:
    """What the endpoint reports; the supervisor calls :meth:`tick` on every turn of its loop."""

    def __init__(self, broker_ok: Callable[[], None], workers_ok: Callable[[], bool]) -> None:
        self.broker_ok = broker_ok
        self.workers_ok = workers_ok
        self.last_tick = time.monotonic()
        self.draining = False

    def tick(self) -> None:
        self.last_tick = time.monotonic()

    def live(self) -> tuple[bool, str]:
        if self.draining:  # the loop has stopped turning on purpose: a drain is no reason to be killed
            return True, "draining"
        if time.monotonic() - self.last_tick < STALE_AFTER:
            return True, "ok"
        return False, "supervisor loop stalled"

    def ready(self) -> tuple[bool, str]:
        alive, why = self.live()
        if not alive:
            return alive, why
        if self.draining:
            return False, "draining"
        if not self.workers_ok():
            return False, "a worker process is not running"
        try:
            self.broker_ok()
        except Exception:
            return False, "broker unreachable"
        return True, "ok"


def serve(health: Health, host: str, port: int) -> ThreadingHTTPServer:
    """Serve ``health`` on ``host:port`` from a daemon thread; the caller shuts the server down."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            checks = {"/livez": health.live, "/healthz": health.ready}
            check = checks.get(self.path.split("?", 1)[0])
            ok, why = check() if check else (False, "not found")
            body = (why + "\n").encode()
            self.send_response(200 if ok else 404 if check is None else 503)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # probes every few seconds: no access log
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="conveyor-health", daemon=True).start()
    return server

"""Helpers for the observability tests: a real API server, a real webhook receiver, scraping.

Everything here runs for real on loopback ports: uvicorn in a thread,
``http.server`` as the chat receiver, conveyor workers in-process or as
``python -m conveyor`` subprocesses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

from prometheus_client.parser import text_string_to_metric_families

from conveyor.app import App
from conveyor.settings import Settings
from tests.support.harness import ROOT
from tests.support.servers import free_port
from tests.support.waiting import wait_for

#: The admin token of these tests.
TOKEN = "test-admin-token-5f1c"

#: A secret payload value no page, body or log line may ever contain.
SECRET = "sk-live-SECRET-9f8e7d6c"

#: Fast retries, so a job fails for good within a second.
FAST_QUEUES = {"indexing": {"min_backoff": 0.02, "max_backoff": 0.05}}


def settings(**overrides) -> Settings:
    values = dict(
        imports="tests.support.obs_jobs",
        queues=FAST_QUEUES,
        admin_token=TOKEN,
        shutdown_timeout=5,
        maintenance_interval=0.5,
        metrics_port=0,
    )
    values.update(overrides)
    return Settings(**values)


def broker_app(request, broker: str, **overrides) -> App:
    """An App on ``broker`` ("redis", "postgres", "inline"), with this test's private servers."""
    if broker == "redis":
        overrides.update(redis_url=request.getfixturevalue("redis_url"))
    elif broker == "postgres":
        # Short poll, recovery and lease, as the core suite's harness uses.
        overrides.update(
            database_url=request.getfixturevalue("database_url"),
            pg_poll_seconds=0.5,
            pg_recovery_seconds=0.5,
            pg_lease_seconds=2,
        )
    return App(settings(broker=broker, **overrides))


def redis_app(redis_url: str, **overrides) -> App:
    return App(settings(broker="redis", redis_url=redis_url, **overrides))


@contextmanager
def worker(app: App, queue: str = "indexing", threads: int | None = None) -> Iterator:
    """A real ProcessWorker for ``queue`` in this process (redis broker), stopped on exit."""
    from conveyor.tasks.worker import ProcessWorker

    process_worker = ProcessWorker(app, queue, threads)
    process_worker.start()
    try:
        yield process_worker
    finally:
        process_worker.stop()


@contextmanager
def running(app: App, queue: str = "indexing", threads: int | None = None, *, own_app: bool = False) -> Iterator:
    """Workers for ``queue`` on any broker: InlineWorkers on ``app`` itself (inline), else a ProcessWorker.

    ``own_app=True`` gives a redis worker an App of its own, as a separate worker process would have.
    """
    from conveyor.tasks.worker import InlineWorkers

    if app.capabilities.in_process:
        workers = InlineWorkers(app, [queue]).start()
        try:
            yield
        finally:
            workers.stop()
        return
    worker_app = App(app.settings) if own_app else app
    try:
        with worker(worker_app, queue, threads):
            yield
    finally:
        if own_app:
            worker_app.close()


@contextmanager
def api_server(app: App) -> Iterator[str]:
    """``conveyor api``'s application on uvicorn in a thread; yields its base URL."""
    import uvicorn

    from conveyor.api import create_app

    config = uvicorn.Config(
        create_app(app), host="127.0.0.1", port=free_port(), log_config=None, access_log=False, lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=20, message="uvicorn to start")
    try:
        yield f"http://127.0.0.1:{config.port}"
    finally:
        server.should_exit = True
        thread.join(10)


class Receiver:
    """A chat webhook receiver on loopback.

    ``mode``: "ok" (200), "error" (500), "refuse" (400) or "slow" (sleeps ``delay``, then 200).
    """

    def __init__(self, mode: str = "ok", delay: float = 0.0) -> None:
        self.mode = mode
        self.delay = delay
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver.lock:
                    receiver.requests.append(
                        {"path": self.path, "body": body.decode(), "content_type": self.headers.get("content-type")}
                    )
                if receiver.mode == "slow":
                    time.sleep(receiver.delay)
                status = {"error": 500, "refuse": 400}.get(receiver.mode, 200)
                try:
                    self.send_response(status)
                    self.send_header("content-length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the client gave up (its timeout): fine

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/T000/B000/abcdef"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def bodies(self) -> list[dict]:
        with self.lock:
            return [json.loads(r["body"]) for r in self.requests]

    def count(self) -> int:
        with self.lock:
            return len(self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Prometheus text as {(sample name, sorted label items): value}."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(text_or_samples, name: str, **labels) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels`` (0 when none)."""
    data = samples(text_or_samples) if isinstance(text_or_samples, str) else text_or_samples
    want = set(labels.items())
    return sum(v for (n, items), v in data.items() if n == name and want <= set(items))


def registry_text(app: App) -> str:
    from prometheus_client import generate_latest

    from conveyor.middleware.metrics import find_metrics

    return generate_latest(find_metrics(app.broker).registry).decode()


class CliProcess:
    """``python -m conveyor ARGS`` with the given environment, its stderr kept in a file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = open(log, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "conveyor", *args],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            code = self.process.wait()
        self._log.close()
        return code


def cli_env(clean_env, **variables: str) -> dict[str, str]:
    """The environment for a conveyor subprocess: this test's clean one plus ``variables``."""
    for name, val in variables.items():
        clean_env.setenv(name, val)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return env

"""Building apps and workers for tests, the same way on every broker."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg

from conveyor.app import App
from conveyor.platform.queues import QUEUES
from conveyor.settings import Settings
from conveyor.tasks.worker import InlineWorkers, ProcessWorker

ROOT = Path(__file__).resolve().parents[2]

#: Fast retries and recovery for tests: settings, never longer sleeps.
FAST_QUEUES = {q: {"min_backoff": 0.05, "max_backoff": 0.2} for q in QUEUES}

#: Milliseconds before Dramatiq restarts a consumer after a connection error (default 3000).
CONSUMER_RESTART_DELAY_MS = 200

FAST = {
    "heartbeat_timeout": 2,
    "maintenance_interval": 0.2,
    "shutdown_timeout": 20,
    "worker_idle_timeout": 0.1,
    "worker_restart_backoff": 0.05,
    "pg_poll_seconds": 0.5,
    "pg_recovery_seconds": 0.5,
    "pg_lease_seconds": 2,
    "imports": "tests.support.jobs",
}


def make_settings(broker: str, redis_url: str | None, database_url: str, **overrides) -> Settings:
    values = {
        **FAST,
        "broker": broker,
        "redis_url": redis_url,
        "database_url": database_url,
        "queues": FAST_QUEUES,
        **overrides,
    }
    return Settings(**values)


@contextlib.contextmanager
def running(app: App, *queues: str) -> Iterator[None]:
    """Workers for ``queues`` inside this process, stopped (drained) at the end."""
    if app.capabilities.in_process:
        workers = InlineWorkers(app, list(queues)).start()
        try:
            yield
        finally:
            workers.stop()
        return
    started = [ProcessWorker(app, q) for q in queues]
    for worker in started:
        worker.start()
    try:
        yield
    finally:
        for worker in started:
            worker.stop()


def env_for(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment a subprocess needs to run with ``settings``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CONVEYOR_") and k not in ("REDIS_URL", "DATABASE_URL", "JOB_FAILURE_WEBHOOK_URL")
    }
    env.update(
        PYTHONPATH=str(ROOT),
        # Dramatiq's own knob (ms, read at import): a consumer that lost its broker connection
        # starts again after it. Its 3 s default was most of a server restart's cost in tests.
        dramatiq_restart_delay=str(CONSUMER_RESTART_DELAY_MS),
        CONVEYOR_BROKER=settings.broker_name,
        DATABASE_URL=settings.database_url or "",
        CONVEYOR_IMPORTS=settings.imports,
        CONVEYOR_HEARTBEAT_TIMEOUT=str(settings.heartbeat_timeout),
        CONVEYOR_MAINTENANCE_INTERVAL=str(settings.maintenance_interval),
        CONVEYOR_SHUTDOWN_TIMEOUT=str(settings.shutdown_timeout),
        CONVEYOR_WORKER_IDLE_TIMEOUT=str(settings.worker_idle_timeout),
        CONVEYOR_WORKER_RESTART_BACKOFF=str(settings.worker_restart_backoff),
        CONVEYOR_PG_POLL_SECONDS=str(settings.pg_poll_seconds),
        CONVEYOR_PG_RECOVERY_SECONDS=str(settings.pg_recovery_seconds),
        CONVEYOR_PG_LEASE_SECONDS=str(settings.pg_lease_seconds),
    )
    if settings.redis_url:
        env["REDIS_URL"] = settings.redis_url
    if settings.redis_wait_replicas:
        env["CONVEYOR_REDIS_WAIT_REPLICAS"] = str(settings.redis_wait_replicas)
    if settings.database_pooled:
        env["CONVEYOR_DATABASE_POOLED"] = "true"
    if settings.listen_database_url:
        env["CONVEYOR_LISTEN_DATABASE_URL"] = settings.listen_database_url
    for queue, override in settings.queues.items():
        for field, value in override.model_dump(exclude_none=True).items():
            env[f"CONVEYOR_QUEUES__{queue.upper()}__{field.upper()}"] = str(value)
    env.update(extra)
    return env


def start_worker(
    settings: Settings,
    queues: str,
    processes: int = 1,
    *,
    stderr: Any = subprocess.DEVNULL,
    prefix: Sequence[str] = (),
    **extra_env: str,
) -> subprocess.Popen:
    """Start ``conveyor worker`` for ``queues`` as its own session, configured only by ``settings`` (and ``extra_env``).

    ``prefix`` runs it under another command (``ip netns exec NS`` puts it on another network);
    its JSON log lines go to ``stderr``. The one way tests and the fault suite start workers.
    """
    return subprocess.Popen(
        [*prefix, sys.executable, "-m", "conveyor", "worker", "--queues", queues, "--processes", str(processes)],
        env=env_for(settings, **extra_env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        cwd=ROOT,
        start_new_session=True,
    )


class WorkerProcess:
    """``conveyor worker`` as a subprocess; its children's pids are read from its JSON log."""

    def __init__(
        self,
        settings: Settings,
        queues: str,
        processes: int = 1,
        log: Path | None = None,
        *,
        prefix: Sequence[str] = (),
        **extra_env: str,
    ) -> None:
        self.log = log
        self._stop_sent = False
        self._log_file = open(log, "wb") if log else subprocess.DEVNULL
        self._command = (settings, queues, processes, tuple(prefix), extra_env)
        #: Times :meth:`start_again` started it after it exited.
        self.restarts = 0
        self.proc = start_worker(settings, queues, processes, stderr=self._log_file, prefix=prefix, **extra_env)

    def start_again(self) -> None:
        """Start the same command again after it exited, as a process manager would; its log goes on."""
        assert self.proc.poll() is not None, "start_again of a worker that still runs"
        settings, queues, processes, prefix, extra_env = self._command
        self.proc = start_worker(settings, queues, processes, stderr=self._log_file, prefix=prefix, **extra_env)
        self.restarts += 1

    def events(self, name: str | None = None) -> list[dict]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if name is None or row.get("event") == name:
                    out.append(row)
        return out

    def child_pids(self) -> list[int]:
        """Pids of children currently running (started and not stopped)."""
        alive = []
        for pid in dict.fromkeys(e["pid"] for e in self.events("worker_started")):
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        return alive

    def send_stop(self) -> None:
        """SIGTERM without waiting: several workers drain at once, then `terminate()` waits for each."""
        if self.proc.poll() is None and not self._stop_sent:
            self.proc.send_signal(signal.SIGTERM)
            self._stop_sent = True

    def terminate(self, timeout: float = 60) -> int:
        self.send_stop()
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            if self._log_file is not subprocess.DEVNULL:
                self._log_file.close()


def probe_runs(database_url: str, token_prefix: str = "") -> list[dict]:
    with psycopg.connect(database_url) as conn:
        cur = conn.execute(
            "SELECT token, job_id, attempt, pid, started_at, finished_at FROM probe_runs "
            "WHERE token LIKE %s ORDER BY id",
            (token_prefix + "%",),
        )
        names = [c.name for c in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]


def probe_dead(database_url: str) -> list[dict]:
    with psycopg.connect(database_url) as conn:
        cur = conn.execute("SELECT job_id, token, error FROM probe_dead")
        return [dict(zip(("job_id", "token", "error"), row)) for row in cur.fetchall()]


def peak_concurrency(runs: list[dict]) -> int:
    """The most runs overlapping at any instant, from their start and finish times."""
    points = []
    for run in runs:
        points.append((run["started_at"], 1))
        points.append((run["finished_at"], -1))
    peak = current = 0
    for _, delta in sorted(points, key=lambda p: (p[0], p[1])):
        current += delta
        peak = max(peak, current)
    return peak

"""conveyor itself, on Redis and on its Postgres broker, with everything a production worker runs.

The worker process is conveyor's own :class:`~conveyor.tasks.worker.ProcessWorker`
(Dramatiq worker + maintenance thread) on an :class:`~conveyor.app.App`, so
the whole middleware stack of ``build_middleware`` runs: attempts and job
records (start/ack in the broker's scripts), retries, time limit, current
message, event logs at INFO, and metrics when that middleware exists.
Every job is enqueued with a dedup key, as callers of credit.consume do.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from .base import Peer, Producer, block_forever

#: Jobs per ``enqueue_many`` call when pre-enqueueing.
BULK_CHUNK = 500


def conveyor_settings(env: dict, **overrides):
    """Settings for a bench process: explicit, so nothing in the caller's environment leaks in."""
    from conveyor.settings import Settings

    values = {
        "broker": env["broker"],
        "redis_url": env.get("redis_url"),
        "database_url": env["database_url"],
        "imports": "bench.conveyor_jobs",
        "log_level": "INFO",
        **overrides,
    }
    return Settings(**values)


def log_to_file(level: str, path: Path) -> None:
    """conveyor's JSON logging, as ``conveyor worker`` sets it up, written to ``path`` instead of stderr."""
    from conveyor.logs import configure_logging

    configure_logging(level, stream=open(path, "a", encoding="utf-8"))


def serve_conveyor(env: dict, queue: str, threads: int, ready, go, warm_pool: bool = False) -> None:
    """Run conveyor's ProcessWorker on ``queue`` with ``threads`` threads in this process."""
    from conveyor.app import App
    from conveyor.tasks.worker import ProcessWorker

    app = App(conveyor_settings(env))
    log_to_file(app.settings.log_level, Path(env["run_dir"]) / f"conveyor-{env['broker']}-{os.getpid()}.log")
    worker = ProcessWorker(app, queue, threads)
    if warm_pool:
        _warm(app.pool, threads)
    ready.set()
    go.wait()
    worker.start()
    block_forever()


def _warm(pool, count: int) -> None:
    """Open ``count`` connections now, as a long-running worker's pool already has them."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        for _ in range(count):
            stack.enter_context(pool.connection())


def middleware_names(env: dict) -> list[str]:
    """The middleware a conveyor worker runs with these settings, for the report."""
    from conveyor.app import App

    return [type(m).__name__ for m in App(conveyor_settings(env)).build_middleware()]


class ConveyorProducer(Producer):
    bulk_method = f"JobQueue.enqueue_many, {BULK_CHUNK} per call, each with a dedup key"

    def __init__(self, env: dict) -> None:
        from conveyor.app import App

        self.app = App(conveyor_settings(env))
        self.tag = env["tag"]

    def _request(self, payload: dict):
        from conveyor.tasks.jobqueue import JobRequest

        return JobRequest("bench.noop", payload, key=f"bench:{self.tag}:{payload['i']}")

    def enqueue_bulk(self, payloads: list[dict]) -> None:
        for start in range(0, len(payloads), BULK_CHUNK):
            self.app.jobs.enqueue_many([self._request(p) for p in payloads[start : start + BULK_CHUNK]])

    def send(self, payload: dict) -> None:
        request = self._request(payload)
        self.app.jobs.enqueue(request.job, request.payload, key=request.key)

    def close(self) -> None:
        self.app.close()


class ConveyorRedis(Peer):
    name = "conveyor-redis"
    label = "conveyor (Redis)"
    backend = "redis"
    distributions = ("dramatiq", "redis")

    def setup(self, servers, tag: str) -> dict:
        servers.flush_redis()
        return {
            "broker": "redis",
            "redis_url": servers.redis_url,
            "database_url": servers.admin_url,
            "run_dir": str(servers.run_dir),
            "tag": tag,
        }

    def producer(self, env: dict) -> Producer:
        return ConveyorProducer(env)

    def serve(self, env: dict, threads: int, ready, go) -> None:
        from bench.conveyor_jobs import QUEUE

        serve_conveyor(env, QUEUE, threads, ready, go)

    def describe(self) -> str:
        return (
            "conveyor ProcessWorker, full middleware, JSON event logs at INFO to a file, "
            "every job enqueued with a dedup key"
        )


class ConveyorPostgres(ConveyorRedis):
    name = "conveyor-postgres"
    label = "conveyor (Postgres)"
    backend = "postgres"
    distributions = ("dramatiq", "psycopg")

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("conveyor.brokers.postgres") is None:
            return "not measured: broker not merged yet (conveyor/brokers/postgres.py is absent)"
        return None

    def setup(self, servers, tag: str) -> dict:
        from conveyor.schema.migrate import migrate

        url = servers.fresh_database("conveyor")
        migrate(url)
        return {"broker": "postgres", "database_url": url, "run_dir": str(servers.run_dir), "tag": tag}

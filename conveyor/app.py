"""The process's conveyor: settings, job types, broker, database pool and JobQueue, built once."""

from __future__ import annotations

import logging
import threading
from functools import cached_property
from typing import Any

from .logs import log_event
from .settings import Settings, get_settings
from .tasks.context import JobContext
from .tasks.jobqueue import JobQueue
from .tasks.queues import queue_specs
from .tasks.registry import load_job_types

logger = logging.getLogger(__name__)


class App:
    """Everything a producer or a worker process needs, created lazily.

    Use one per process: ``App()`` reads the environment; tests pass their own :class:`Settings`.
    """

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self.job_types = dict(load_job_types(self.settings.import_modules))
        self.queues = queue_specs(self.settings)
        self._lock = threading.Lock()
        self._pool = None

    @cached_property
    def database_url(self) -> str:
        """``DATABASE_URL``, or the embedded Postgres started (and migrated) on first use."""
        if self.settings.database_url:
            return self.settings.database_url
        from .embedded import start_embedded
        from .ledger.migrate import migrate

        url = start_embedded(self.settings.data_dir)
        migrate(url)
        return url

    @cached_property
    def broker(self):
        """The configured broker with every job type declared on it."""
        from .brokers import build_broker

        return build_broker(self)

    @cached_property
    def jobs(self) -> JobQueue:
        """The JobQueue: ``app.jobs.enqueue(job, payload, key=..., delay=...)``."""
        return JobQueue(self)

    @property
    def pool(self):
        """A psycopg connection pool on the database, opened on first use."""
        with self._lock:
            if self._pool is None:
                from .db import open_pool

                self._pool = open_pool(self.database_url)
            return self._pool

    def final_failure(self, broker: Any, message: Any, error: str) -> None:
        """Run once when a job has spent its attempts: its job type's hook, then every middleware's ``after_job_dead``."""
        job_type = self.job_types.get(message.actor_name)
        if job_type and job_type.on_final_failure:
            from .tasks.actors import load_payload

            try:
                payload = load_payload(job_type, message.args[0] if message.args else None)
            except Exception:
                payload = None
            ctx = JobContext(job_type.name, job_type.queue, message.message_id,
                             message.options.get("attempt", 0), message.options.get("attempt", 0), self)
            try:
                job_type.on_final_failure(payload, error, ctx)
            except Exception as exc:
                log_event("error", level="error", queue=message.queue_name, job=message.actor_name,
                          job_id=message.message_id, attempt=message.options.get("attempt"),
                          error=f"final-failure hook raised {type(exc).__name__}: {exc}")
        for middleware in broker.middleware:
            hook = getattr(middleware, "after_job_dead", None)
            if hook:
                try:
                    hook(broker, message, error)
                except Exception:
                    logger.exception("after_job_dead of %r failed", middleware)

    def close(self) -> None:
        """Close the pool and the broker's connections."""
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None
        if "broker" in self.__dict__:
            self.broker.close()

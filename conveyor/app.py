"""The process's conveyor: settings, job types, broker, database pool and JobQueue, built once."""

from __future__ import annotations

import logging
import threading
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence, TypeVar, cast

from conveyor.appcache import Closeable
from conveyor.backends import Backend, backend_for
from conveyor.blueprints import DEFAULT, Jobs, JobType, Schedule, blueprints_in, compose
from conveyor.errors import ConfigurationError, ConveyorError, InvalidPayload, StoreUnavailable
from conveyor.events import Events
from conveyor.importing import import_job_module
from conveyor.logs import log_job_error
from conveyor.settings import Settings, describe_invalid, get_settings
from conveyor.tasks.context import JobContext
from conveyor.tasks.jobqueue import JobQueue, validate_payload
from conveyor.tasks.queues import queue_specs, with_budget_overrides

if TYPE_CHECKING:
    from dramatiq import Middleware
    from psycopg import Connection
    from psycopg_pool import ConnectionPool
    from pydantic_settings import BaseSettings

    from conveyor.brokers.base import AnyMessage, Capabilities, ConveyorBroker
    from conveyor.scheduling.managed import CronSchedules

logger = logging.getLogger(__name__)

R = TypeVar("R", bound=Closeable)
S = TypeVar("S", bound="BaseSettings")

#: The agent platform's job module, loaded by name like a user's ``CONVEYOR_IMPORTS`` unless
#: ``CONVEYOR_PLATFORM=false``; the library never imports the platform itself.
PLATFORM_JOBS = "conveyor.platform.jobs"


def blueprint_modules(settings: Settings) -> list[str]:
    """The modules an App built from the environment takes its blueprints from: the platform's, CONVEYOR_IMPORTS'."""
    return [*([PLATFORM_JOBS] if settings.platform else []), *settings.import_modules]


def environment_blueprints() -> list[Jobs]:
    """The blueprints an App built from the environment would hold, of the modules that import: what
    ``conveyor --help`` lists the commands and settings of. Never raises: the command that builds the
    App reports a module that does not import, or settings that do not validate, in one line."""
    from pydantic import ValidationError

    from conveyor.importing import add_paths

    try:
        settings = Settings()  # not get_settings(): main() may yet set CONVEYOR_PATH from --path before that is read
        add_paths(settings.import_paths)
    except ValidationError:
        return []
    found: list[object] = []
    for name in blueprint_modules(settings):
        try:
            found += vars(import_job_module(name, settings.import_paths)).values()
        except ConveyorError:
            continue
    return blueprints_in(found)


class App:
    """Everything a producer or a worker process needs, created lazily.

    ``jobs``: the blueprints (:class:`~conveyor.blueprints.Jobs`) whose job types and queues this
    App runs; left out, they come from the environment: the agent platform's (unless
    ``CONVEYOR_PLATFORM=false``), every blueprint a ``CONVEYOR_IMPORTS`` module holds, and the
    module-level ``@job``'s. ``middleware``: Dramatiq middleware of the user's, run after conveyor's
    (a blueprint can bring its own, which a ``conveyor worker`` gets too: ``jobs.add_middleware``).
    ``App()`` reads the settings from the environment; tests pass their own :class:`Settings`.
    A blueprint's own settings (``jobs.add_settings``: the platform's) are read from the environment
    too, and checked, only when the App includes it; ``blueprint_settings`` gives instances instead.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        jobs: Sequence[Jobs] | None = None,
        middleware: Sequence[Middleware] = (),
        blueprint_settings: Iterable[BaseSettings] = (),
    ) -> None:
        self.settings = settings or get_settings()
        #: The blueprints' own settings objects, by class (:meth:`settings_of`).
        self._blueprint_settings: dict[type, BaseSettings] = {type(obj): obj for obj in blueprint_settings}
        self._blueprint_settings_lock = threading.Lock()
        self.blueprints: list[Jobs] = list(jobs) if jobs is not None else self._blueprints_from_settings()
        composed = compose(self.blueprints)
        for model, _title in composed.settings_classes:
            self.settings_of(model)  # read and validated now: a bad variable stops the App here, not in a job
        for check, of in composed.settings_checks:
            try:
                check(self.settings if of is None else self.settings_of(of))
            except ValueError as exc:
                raise ConfigurationError(str(exc)) from None
        self.queues, self.job_types = with_budget_overrides(
            self.settings, queue_specs(self.settings, composed.queues), composed.job_types
        )
        #: Cron schedules declared in code (``jobs.schedule(...)``), fired by ``conveyor scheduler``.
        self.schedules: dict[str, Schedule] = composed.schedules
        for spec in self.schedules.values():
            try:
                validate_payload(spec.job, self.job_types[spec.job].payload, spec.payload)
            except InvalidPayload as exc:
                raise ConfigurationError(f"schedule {spec.name!r}: {exc}") from None
        # The caller's, then each blueprint's (built for this App), after conveyor's own.
        self.user_middleware = [*middleware, *(make() for b in self.blueprints for make in b.middleware)]
        for blueprint in self.blueprints:
            blueprint.app = self  # the App its handles enqueue on: the last one built with it
        self.backend: Backend = backend_for(self.settings)
        from conveyor.middleware.cancel import Cancels

        #: The jobs this process runs and their cancellations (``ctx.cancelled``; conveyor.middleware.cancel).
        self.cancels = Cancels()
        self._lock = threading.Lock()
        self._pool: ConnectionPool[Connection[Any]] | None = None
        # Per-App objects other modules build on first use (a stream buffer, limits, a provider):
        # the App owns them and close() closes them, newest first.
        self._resources: dict[object, Closeable] = {}
        self._resources_lock = threading.RLock()

    def _blueprints_from_settings(self) -> list[Jobs]:
        """The platform's blueprint (by name), those CONVEYOR_IMPORTS' modules hold, then the default one."""
        found: list[Jobs] = []
        for name in blueprint_modules(self.settings):
            found += vars(import_job_module(name, self.settings.import_paths)).values()
        return blueprints_in([*found, DEFAULT])

    @cached_property
    def database_url(self) -> str:
        """``DATABASE_URL``, or the embedded Postgres started (and migrated) on first use."""
        if self.settings.database_url:
            return self.settings.database_url
        from conveyor.embedded import start_embedded
        from conveyor.schema.migrate import migrate

        url = start_embedded(self.settings.data_dir)
        migrate(url, self.blueprints)
        return url

    def build_middleware(self) -> list[Middleware]:
        """The middleware every broker runs, in order (``after_*`` hooks run in reverse)."""
        from dramatiq.middleware import CurrentMessage

        from conveyor.middleware.cancel import Cancellation
        from conveyor.middleware.events import Events
        from conveyor.middleware.fleet import Fleet
        from conveyor.middleware.metrics import Metrics
        from conveyor.middleware.retries import Retries
        from conveyor.middleware.rollup import Rollup
        from conveyor.middleware.time_limit import TimeLimit
        from conveyor.middleware.webhook import FailureWebhook

        metrics = Metrics()
        # First, when OpenTelemetry is on: a run's span encloses every other hook (conveyor.middleware.tracing).
        tracing: list[Middleware] = [_tracing_middleware(self)] if self.settings.tracing else []
        return [
            *tracing,
            Retries(on_final_failure=self.final_failure, outage_retries=self.settings.outage_retries),
            TimeLimit(),
            CurrentMessage(),
            Events(),
            # After Retries: a message Retries skips never reaches Metrics' before_process_message.
            metrics,
            Rollup(self),
            FailureWebhook(self.settings, self.job_types, metrics, secrets=self.secret_values()),
            # Last of conveyor's: its before_process_message sees the attempt Retries counted.
            Fleet(self),
            # After every other of conveyor's: its after_process_message runs first (reverse order) and
            # marks a cancelled delivery, so Retries, Metrics, Events and the webhook treat it as cancelled.
            Cancellation(self),
            *self.user_middleware,
        ]

    @property
    def capabilities(self) -> Capabilities:
        """What the configured broker declares it can do, read from its class (no broker is built)."""
        return self.backend.capabilities

    @cached_property
    def broker(self) -> ConveyorBroker:
        """The configured broker, with conveyor's middleware and every job type declared on it.

        The composition root: settings -> middleware -> broker -> actors, in this one place.
        """
        from conveyor.tasks.actors import declare_actors

        settings = self.settings
        middleware = self.build_middleware()
        broker = self.backend.broker_class.from_settings(
            settings, middleware=middleware, on_dead=self.final_failure, database_url=lambda: self.database_url
        )
        declare_actors(broker, self)
        broker.group_caps = {n: q.group_concurrency for n, q in self.queues.items() if q.group_concurrency}
        broker.group_weights = {n: dict(q.group_weights) for n, q in self.queues.items() if q.group_weights}
        return broker

    @cached_property
    def jobs(self) -> JobQueue:
        """The JobQueue: ``app.jobs.enqueue(job, payload, key=..., delay=...)``."""
        return JobQueue(self)

    @cached_property
    def cron(self) -> CronSchedules:
        """Cron schedules managed at run time: ``app.cron.add(name, cron=..., job=..., payload=...)``, ``list``,
        ``pause``, ``resume``, ``remove`` (those declared in code are listed too, read-only)."""
        from conveyor.scheduling.managed import CronSchedules

        return CronSchedules(self)

    @cached_property
    def events(self) -> Events:
        """Signals to waiting jobs: ``app.events.signal("approval:run-7", data)`` (see ``ctx.wait_for``)."""
        return Events(self)

    @property
    def pool(self) -> ConnectionPool[Connection[Any]]:
        """A psycopg connection pool on the database, opened on first use."""
        with self._lock:
            if self._pool is None:
                from conveyor.db import open_pool

                self._pool = open_pool(self.database_url, pooled=self.settings.database_pooled)
            return self._pool

    @property
    def pool_opened(self) -> bool:
        """Whether :attr:`pool` was opened (this process uses the database), without opening it."""
        return self._pool is not None

    def max_attempts(self, job_type: JobType) -> int:
        """How many starts ``job_type`` gets: its own ``max_attempts``, else its queue's."""
        return job_type.attempts(self.queues.get(job_type.queue))

    def final_failure(self, broker: ConveyorBroker, message: AnyMessage, error: str) -> None:
        """Run once when a job has spent its attempts: its job type's hook, then every middleware's ``after_job_dead``."""
        job_type = self.job_types.get(message.actor_name)
        if job_type and job_type.store_result:
            from conveyor.results import mark_failed

            try:
                mark_failed(self, job_type, message.message_id)
            except Exception as exc:  # only a wake-up: a reader learns the failure from the broker at its timeout
                log_job_error(message, f"result readers not woken: {type(exc).__name__}", level="warning")
        if job_type and job_type.on_final_failure:
            payload, ctx = self._hook_args(job_type, message)
            try:
                job_type.on_final_failure(payload, error, ctx)
            except StoreUnavailable as exc:
                # Not finished, and a retry may well finish it: keep the job owned, so the hooks run again
                # (a finalize delivery) instead of its nack marking them done with their effect lost.
                broker.leave_unsettled(message, f"final-failure hook raised {type(exc).__name__}")
                return
            except Exception as exc:
                log_job_error(message, f"final-failure hook raised {type(exc).__name__}: {exc}")
        from conveyor.middleware.base import conveyor_middleware

        for middleware in conveyor_middleware(broker):
            try:
                middleware.after_job_dead(broker, message, error)
            except Exception:
                logger.exception("after_job_dead of %r failed", middleware)

    def cancel_hook(self, message: AnyMessage) -> None:
        """Run the job type's ``on_cancel`` hook once for a running job that ended cancelled. Never raises."""
        job_type = self.job_types.get(message.actor_name)
        if job_type is None or job_type.on_cancel is None:
            return
        payload, ctx = self._hook_args(job_type, message)
        try:
            job_type.on_cancel(payload, ctx)
        except BaseException as exc:  # an interrupt too: the outcome is still written
            log_job_error(message, f"cancel hook raised {type(exc).__name__}: {exc}")

    def _hook_args(self, job_type: JobType, message: AnyMessage) -> tuple[Any, JobContext]:
        """A hook's payload (None when it no longer loads: the hook still runs) and its context."""
        from conveyor.tasks.actors import load_payload

        try:
            payload = load_payload(job_type, message.args[0] if message.args else None)
        except Exception:
            payload = None
        ctx = JobContext(
            job=job_type.name,
            queue=job_type.queue,
            job_id=message.message_id,
            attempt=message.options.get("attempt", 0),
            max_attempts=self.max_attempts(job_type),
            app=self,
        )
        return payload, ctx

    def settings_of(self, model: type[S]) -> S:
        """The App's instance of a blueprint's settings class: the one it was given, else read from the
        environment once. A bad variable is a :class:`~conveyor.errors.ConfigurationError` naming it (never its value)."""
        from pydantic import ValidationError

        with self._blueprint_settings_lock:
            found = self._blueprint_settings.get(model)
            if found is None:
                try:
                    found = self._blueprint_settings[model] = model()
                except ValidationError as exc:
                    raise ConfigurationError(f"invalid settings: {describe_invalid(model, exc)}") from None
            return cast(S, found)

    @property
    def all_settings(self) -> list[Any]:
        """The library's settings and every blueprint settings object the App holds (what scrubbing reads)."""
        with self._blueprint_settings_lock:
            return [self.settings, *self._blueprint_settings.values()]

    def secret_values(self) -> list[str]:
        """Every secret value of :attr:`all_settings`: what logs, errors and the dashboard never show."""
        from conveyor.redaction import settings_secrets

        return settings_secrets(*self.all_settings)

    def resource(self, key: object, build: Callable[[], R]) -> R:
        """The App's one object under ``key``, built by ``build()`` on first use and closed by :meth:`close`."""
        with self._resources_lock:
            if key not in self._resources:
                self._resources[key] = build()
            # The object under a key is always what that key's one builder returns.
            return cast(R, self._resources[key])

    def close(self) -> None:
        """Close every backend the App opened: per-App objects (newest first), the pool, the broker."""
        if "broker" in self.__dict__:  # its chart counts written first, while the pool and broker are open
            from conveyor.middleware.rollup import find_rollup

            rollup = find_rollup(self.broker)
            if rollup is not None:
                rollup.close()
        with self._resources_lock:
            resources, self._resources = list(self._resources.values()), {}
        for obj in reversed(resources):
            try:
                obj.close()
            except Exception:
                logger.exception("closing %r failed", obj)
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None
        if "broker" in self.__dict__:
            self.broker.close()


def _tracing_middleware(app: App) -> Middleware:
    from conveyor.middleware.tracing import Tracing

    return Tracing(app.settings, app.job_types, secrets=app.secret_values())


def run_worker_process(queue: str, threads: int | None = None) -> None:
    """Entry point of one worker process (``conveyor worker``'s children): run until SIGTERM or SIGINT,
    then drain and exit. Here, not in tasks/worker.py: the process's App is built by the composition root."""
    import signal

    from conveyor.importing import add_paths
    from conveyor.logs import configure_logging
    from conveyor.settings import get_settings
    from conveyor.tasks.worker import ProcessWorker

    add_paths(get_settings().import_paths)  # the parent's --path, passed down as CONVEYOR_PATH
    app = App()
    configure_logging(app.settings.log_level, secrets=app.secret_values())
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    worker = ProcessWorker(app, queue, threads)
    worker.start()
    cron = None
    if app.settings.worker_schedules:
        from conveyor.scheduling.firing import CronFirer

        # Code schedules and managed ones (added at run time, so fired even when there are none yet).
        # Any number of workers may fire: an occurrence's keyed enqueue makes it once.
        cron = threading.Thread(target=CronFirer(app).run, args=(stop,), name="conveyor-cron", daemon=True)
        cron.start()
    stop.wait()
    if cron is not None:
        cron.join(timeout=app.settings.shutdown_timeout)
    worker.stop()
    app.close()

"""Prometheus metrics: what happens to jobs, counted where it happens.

One family per fact, labelled ``queue`` and ``job`` (see ``docs/observability.md``
for what each means). Workers count in their own process; with several
worker processes the :class:`WorkerMetrics` of the supervisor points
``PROMETHEUS_MULTIPROC_DIR`` at a directory it empties at start, and
serves the sum of every process's files. Queue depth and the fleet's
totals (jobs enqueued by any producer, completed, failed for good) are not
counted but read from the broker at scrape time by :class:`QueueCollector`,
which the API's ``/metrics`` serves: a job enqueued by the CLI or by a
script nobody scrapes is counted all the same.

Unlike Dramatiq's own Prometheus middleware, a retry is counted once, when
the worker schedules it, under the job's queue (Dramatiq's counts it again
when the delay queue ``<queue>.DQ`` hands it back).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from dramatiq import Broker, Message, Worker
from dramatiq.broker import MessageProxy
from dramatiq.common import q_name
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from conveyor.brokers.base import CANCELLED, AnyMessage, ConveyorBroker, EnqueueItem, JobRef, QueueCounts
from conveyor.errors import RetryLater
from conveyor.logs import log_error, log_event
from conveyor.middleware.base import ConveyorMiddleware

#: Ports a supervisor tries, from the configured one up, when another supervisor on the host has it.
METRICS_PORT_TRIES = 16

if TYPE_CHECKING:
    from threading import Thread
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric

    from conveyor.app import App
    from conveyor.tasks.context import JobContext

#: Run time buckets (s): credit charges take milliseconds, agent runs up to the 30 min limit.
RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600)

#: Wait buckets (s), from ready to started: a healthy queue starts jobs within
#: milliseconds; minutes mean the group is too small or down.
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

#: Message option holding when the message became ready to run (ms): its
#: enqueue, or the end of its delay. Dramatiq drops ``eta`` when a delayed
#: message reaches its queue, so the wait is measured from this instead.
READY_OPTION = "ready_ms"

_LABELS = ("queue", "job")


@dataclasses.dataclass(frozen=True, slots=True)
class _JobSeries:
    """One (queue, job)'s children of the metrics every run updates."""

    wait_seconds: Histogram
    started: Counter
    in_flight: Gauge
    run_seconds: Histogram
    completed: Counter
    failed: Counter
    cancelled: Counter


class Metrics(ConveyorMiddleware):
    """Counts enqueues, starts, outcomes, retries and dead jobs; times waits and runs.

    Metric objects live in :attr:`registry`, one per middleware, so several
    apps in one process (tests) never clash. In a worker process started by
    the supervisor, prometheus-client writes them to the multi-process
    directory as well.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.deduplicated = Counter(
            "conveyor_jobs_deduplicated",
            "Enqueues that returned an earlier job with the same key instead of adding one.",
            _LABELS,
            registry=r,
        )
        self.started = Counter("conveyor_jobs_started", "Attempts started (every start of a job).", _LABELS, registry=r)
        self.completed = Counter("conveyor_jobs_completed", "Attempts that succeeded.", _LABELS, registry=r)
        self.failed = Counter(
            "conveyor_jobs_failed", "Attempts that raised an error (RetryLater excluded).", _LABELS, registry=r
        )
        self.cancelled = Counter(
            "conveyor_jobs_cancelled",
            "Jobs a worker ended cancelled (at their start, or while running); a waiting job cancelled by "
            "the API is counted by the queue's cancelled gauge only.",
            _LABELS,
            registry=r,
        )
        self.retried = Counter(
            "conveyor_jobs_retried", "Retries scheduled by workers, once per retry.", _LABELS, registry=r
        )
        self.dead = Counter(
            "conveyor_jobs_dead",
            "Jobs that spent their attempts or failed permanently (once per job).",
            _LABELS,
            registry=r,
        )
        self.unknown = Counter(
            "conveyor_unknown_jobs",
            "Deliveries handed back unattempted: no worker here knows the job type (a rolling deploy).",
            _LABELS,
            registry=r,
        )
        self.in_flight = Gauge(
            "conveyor_jobs_in_flight", "Jobs running now.", _LABELS, registry=r, multiprocess_mode="livesum"
        )
        self.concurrency = Gauge(
            "conveyor_queue_concurrency",
            "Worker threads consuming the queue in live worker processes.",
            ("queue",),
            registry=r,
            multiprocess_mode="livesum",
        )
        self.recycled = Counter(
            "conveyor_worker_recycled",
            "Worker processes drained and replaced (--max-jobs-per-process, --max-memory-per-process), by reason.",
            ("queue", "reason"),
            registry=r,
        )
        self.run_seconds = Histogram(
            "conveyor_job_run_seconds", "Run time of each attempt.", _LABELS, buckets=RUN_BUCKETS, registry=r
        )
        self.wait_seconds = Histogram(
            "conveyor_job_wait_seconds",
            "Time from ready (enqueued, or delay over) to started, per attempt.",
            _LABELS,
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.webhook_deliveries = Counter(
            "conveyor_webhook_deliveries", "Failure alerts the webhook receiver accepted.", _LABELS, registry=r
        )
        self.webhook_failures = Counter(
            "conveyor_webhook_failures",
            "Failure alerts lost: given up after every attempt, or dropped because too many were pending.",
            (*_LABELS, "reason"),
            registry=r,
        )
        self.ledger_consumptions = Counter(
            "conveyor_ledger_consumptions",
            "credit.consume runs by outcome: applied, or duplicate (already charged; nothing changed).",
            (*_LABELS, "outcome"),
            registry=r,
        )
        self.budget_throttled_jobs = Counter(
            "conveyor_budget_throttled",
            "Starts a budget had no room for (the job waits, RetryLater), per refusing budget.",
            ("budget", *_LABELS),
            registry=r,
        )
        self.budget_wait_seconds = Counter(
            "conveyor_budget_wait_seconds",
            "Seconds throttled jobs were told to wait by their budgets, per refusing budget.",
            ("budget", *_LABELS),
            registry=r,
        )
        # Start times of running messages, by proxy identity (one proxy per delivery).
        self._running: dict[int, float] = {}
        self._job_series: dict[tuple[str, str], _JobSeries] = {}
        self._booted: dict[int, list[tuple[str, int]]] = {}
        self._lock = threading.Lock()

    # -- enqueue ---------------------------------------------------------------

    def before_enqueue(self, broker: Broker, message: Message[Any], delay: int) -> None:
        message.options[READY_OPTION] = int(time.time() * 1000) + (delay or 0)

    def after_enqueue(self, broker: Broker, message: Message[Any], delay: int) -> None:
        # A retry is the one enqueue that carries the attempt it follows and a
        # delay; the delay queue handing the message back has no delay.
        if delay is not None and "attempt" in message.options:
            self.retried.labels(q_name(message.queue_name), message.actor_name).inc()

    def after_enqueue_jobs(self, broker: ConveyorBroker, items: list[EnqueueItem], refs: list[JobRef]) -> None:
        """Called by :class:`~conveyor.tasks.jobqueue.JobQueue` with each batch and its results."""
        # Enqueues themselves are the fleet's count, kept by the broker (QueueCollector): only this
        # process's duplicates are counted here.
        for item, ref in zip(items, refs):
            if ref.deduplicated:
                self.deduplicated.labels(q_name(item.message.queue_name), item.message.actor_name).inc()

    # -- running ---------------------------------------------------------------

    def _series(self, message: MessageProxy) -> _JobSeries:
        """The labelled children one job type's runs update, looked up once per (queue, job) and kept:
        ``.labels()`` was about a twentieth of a no-op job's worker CPU (six lookups per run)."""
        key = (message.queue_name, message.actor_name)
        series = self._job_series.get(key)
        if series is None:
            labels = (q_name(message.queue_name), message.actor_name)
            series = _JobSeries(
                wait_seconds=self.wait_seconds.labels(*labels),
                started=self.started.labels(*labels),
                in_flight=self.in_flight.labels(*labels),
                run_seconds=self.run_seconds.labels(*labels),
                completed=self.completed.labels(*labels),
                failed=self.failed.labels(*labels),
                cancelled=self.cancelled.labels(*labels),
            )
            self._job_series[key] = series  # a racing thread builds the same children: last one kept
        return series

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        series = self._series(message)
        now = time.time()
        ready_ms = message.options.get(READY_OPTION) or message.message_timestamp
        series.wait_seconds.observe(max(0.0, now - ready_ms / 1000))
        series.started.inc()
        series.in_flight.inc()
        self._running[id(message)] = time.monotonic()

    def after_process_message(
        self, broker: Broker, message: MessageProxy, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        started = self._running.pop(id(message), None)
        if started is None:
            return
        series = self._series(message)
        series.in_flight.dec()
        series.run_seconds.observe(time.monotonic() - started)
        if message.options.get(CANCELLED):
            series.cancelled.inc()
        elif exception is None:
            series.completed.inc()
        elif not isinstance(exception, RetryLater):
            series.failed.inc()

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        if message.options.get(CANCELLED):
            self.cancelled.labels(q_name(message.queue_name), message.actor_name).inc()
        if self._running.pop(id(message), None) is not None:
            self.in_flight.labels(q_name(message.queue_name), message.actor_name).dec()

    def after_job_dead(self, broker: ConveyorBroker, message: AnyMessage, error: str) -> None:
        self.dead.labels(q_name(message.queue_name), message.actor_name).inc()

    def after_unknown_job(self, broker: ConveyorBroker, message: AnyMessage) -> None:
        self.unknown.labels(q_name(message.queue_name), message.actor_name).inc()

    # -- worker threads ----------------------------------------------------------

    def after_worker_boot(self, broker: Broker, worker: Worker) -> None:
        queues = worker.consumer_whitelist or broker.get_declared_queues()
        booted = [(q, _concurrency(worker)) for q in sorted(queues) if q == q_name(q)]
        with self._lock:
            self._booted[id(worker)] = booted
        for queue, threads in booted:
            self.concurrency.labels(queue).inc(threads)

    def after_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        with self._lock:
            booted = self._booted.pop(id(worker), [])
        for queue, threads in booted:
            self.concurrency.labels(queue).dec(threads)

    # -- webhook and ledger --------------------------------------------------------

    def webhook_delivered(self, queue: str, job: str) -> None:
        self.webhook_deliveries.labels(queue, job).inc()

    def webhook_lost(self, queue: str, job: str, reason: str) -> None:
        self.webhook_failures.labels(queue, job, reason).inc()

    def budget_throttled(self, budget: str, queue: str, job: str, delay: float) -> None:
        self.budget_throttled_jobs.labels(budget, queue, job).inc()
        self.budget_wait_seconds.labels(budget, queue, job).inc(delay)

    def ledger_consumption(self, queue: str, job: str, applied: bool) -> None:
        self.ledger_consumptions.labels(queue, job, "applied" if applied else "duplicate").inc()


def find_metrics(broker: Broker) -> Metrics | None:
    """The broker's :class:`Metrics` middleware, if it has one."""
    return next((m for m in broker.middleware if isinstance(m, Metrics)), None)


def record_ledger_consumption(ctx: "JobContext", applied: bool) -> None:
    """Count one credit consumption of a running job as applied or duplicate."""
    metrics = find_metrics(ctx.app.broker)
    if metrics is not None:
        metrics.ledger_consumption(ctx.queue, ctx.job, applied)


class QueueCollector(Collector):
    """Queue depth by state, oldest waiting age and paused flag, read from the broker at each scrape.

    A broker that cannot be read yields ``conveyor_broker_up 0`` and nothing
    else, so a scrape never fails and the outage shows on the dashboard.
    """

    def __init__(self, app: App) -> None:
        self.app = app

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("conveyor_broker_up", "1 when the broker answered this scrape, else 0.")
        try:
            counts = [self.app.broker.queue_counts(queue) for queue in self.app.queues]
        except Exception as exc:
            log_error(f"metrics scrape could not read the broker: {type(exc).__name__}: {exc}")
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        warning = GaugeMetricFamily(
            "conveyor_broker_config_warning",
            "1 for each way the broker's configuration can lose acknowledged jobs (see the dashboard's banner).",
            labels=["reason"],
        )
        with contextlib.suppress(Exception):
            for reason in self.app.broker.config_warning_reasons():
                warning.add_metric([reason], 1)
        yield warning
        depth = GaugeMetricFamily(
            "conveyor_queue_depth",
            "Jobs in the queue by state: waiting, delayed, active (claimed by a worker: running, started, plus "
            "prefetched, fetched ahead and not started), running, prefetched, failed (failed for good).",
            labels=["queue", "state"],
        )
        oldest = GaugeMetricFamily(
            "conveyor_queue_oldest_waiting_seconds",
            "How long the oldest waiting job has waited to be started (0 when none waits).",
            labels=["queue"],
        )
        paused = GaugeMetricFamily("conveyor_queue_paused", "1 while the queue is paused.", labels=["queue"])
        now = time.time()
        for c in counts:
            for state in ("waiting", "delayed", "awaiting", "active", "running", "prefetched", "failed"):
                depth.add_metric([c.queue, state], getattr(c, state))
            oldest.add_metric([c.queue], max(0.0, now - c.oldest_waiting_at) if c.oldest_waiting_at else 0.0)
            paused.add_metric([c.queue], 1 if c.paused else 0)
        yield from (depth, oldest, paused)
        yield from self._totals(counts)

    def _totals(self, counts: list[QueueCounts]) -> Iterator[Metric]:
        """The fleet's totals from the broker's own counters: the same in every process that serves them.

        Several API processes scraped report the same numbers: aggregate with
        ``max``, not ``sum``, across instances.
        """
        completed = CounterMetricFamily(
            "conveyor_queue_completed",
            "Jobs completed, counted by the broker for the whole fleet (API only).",
            labels=["queue"],
        )
        failed = CounterMetricFamily(
            "conveyor_queue_failed",
            "Jobs failed for good, counted by the broker for the whole fleet (API only).",
            labels=["queue"],
        )
        for c in counts:
            completed.add_metric([c.queue], c.completed_total)
            failed.add_metric([c.queue], c.failed_total)
        yield from (completed, failed)
        from conveyor.brokers.fleet import fleet_store

        try:
            totals = fleet_store(self.app).enqueued_totals()
        except Exception as exc:
            log_error(f"metrics scrape could not read the enqueue totals: {type(exc).__name__}: {exc}")
            return
        enqueued = CounterMetricFamily(
            "conveyor_jobs_enqueued",
            "Jobs enqueued by any producer (a keyed "
            "duplicate is not one), counted by the broker for the whole fleet "
            "(API only).",
            labels=["queue", "job"],
        )
        # Every known job type has a series (0 before its first job), and so has every counted one.
        keys = set(totals) | {(jt.queue, jt.name) for jt in self.app.job_types.values()}
        for queue, job in sorted(keys):
            enqueued.add_metric([queue, job], totals.get((queue, job), 0))
        yield enqueued


class RegistryCollector(Collector):
    """Serves another registry's metrics from this one (the API adds the broker's queue collector)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        return self.registry.collect()


def exposition_registry(app: App) -> CollectorRegistry:
    """What the API's ``/metrics`` serves: this process's (or every process's) metrics plus queue depth."""
    registry = CollectorRegistry(auto_describe=False)
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        from prometheus_client.multiprocess import MultiProcessCollector

        MultiProcessCollector(registry, path=path)
    else:
        metrics = find_metrics(app.broker)
        if metrics is not None:
            registry.register(RegistryCollector(metrics.registry))
    registry.register(QueueCollector(app))
    return registry


def budget_totals(app: App) -> dict[str, tuple[float, float]] | None:
    """Per budget: the starts it throttled and the seconds it told them to wait, as ``/metrics`` counts them.

    Summed over every label but ``budget``, from every worker process of this host that shares
    ``PROMETHEUS_MULTIPROC_DIR`` (or, without it, from this process alone). None when this process
    sees no counts at all (no directory, no metrics middleware): the numbers are elsewhere.
    """
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        from prometheus_client.multiprocess import MultiProcessCollector

        families: Iterable[Metric] = MultiProcessCollector(None, path=path).collect()
    else:
        metrics = find_metrics(app.broker)
        if metrics is None:
            return None
        families = metrics.registry.collect()
    totals: dict[str, list[float]] = {}
    wanted = {"conveyor_budget_throttled_total": 0, "conveyor_budget_wait_seconds_total": 1}
    for family in families:
        for sample in family.samples:
            column = wanted.get(sample.name)
            budget = sample.labels.get("budget")
            if column is not None and budget:
                totals.setdefault(budget, [0.0, 0.0])[column] += sample.value
    return {name: (throttled, waited) for name, (throttled, waited) in totals.items()}


class WorkerMetrics:
    """A worker supervisor's metrics: the multi-process directory and its HTTP exposition.

    Construct it before starting worker processes: it empties the directory
    (counts of an earlier run must not add up with this one's) and exports
    ``PROMETHEUS_MULTIPROC_DIR`` to the processes it spawns.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        given = path or os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        self._own_dir = not given
        self.path = Path(given or tempfile.mkdtemp(prefix="conveyor-metrics-"))
        self.path.mkdir(parents=True, exist_ok=True)
        for stale in glob.glob(str(self.path / "*.db")):
            os.remove(stale)
        self._previous_env = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(self.path)
        self._server: WSGIServer | None = None
        self._thread: Thread | None = None

    def serve(self, host: str, port: int) -> int | None:
        """Serve the summed metrics on ``http://host:port/metrics``; returns the port, None when none was free.

        A second supervisor on the same host finds ``port`` taken and takes the next free one of the
        :data:`METRICS_PORT_TRIES` after it, and says which in its log (``metrics_served``), so two
        supervisors never clash and neither runs without metrics.
        """
        from prometheus_client import start_http_server
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(registry, path=str(self.path))
        for candidate in range(port, port + METRICS_PORT_TRIES):
            try:
                self._server, self._thread = start_http_server(candidate, addr=host, registry=registry)
            except OSError:
                continue
            served = self._server.server_port
            log_event(
                "metrics_served",
                level="info" if served == port else "warning",
                queue=None,
                job=None,
                job_id=None,
                attempt=None,
                address=f"{host}:{served}",
                configured_port=port,
            )
            return served
        log_error(f"worker metrics not served: ports {port}-{port + METRICS_PORT_TRIES - 1} on {host} are all taken")
        return None

    def process_died(self, pid: int) -> None:
        """Forget a dead process's live gauges (in-flight, concurrency); its counters keep counting."""
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, str(self.path))

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._own_dir:
            shutil.rmtree(self.path, ignore_errors=True)
        if self._previous_env is None:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        else:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = self._previous_env


def _concurrency(worker: Worker) -> int:
    """The jobs ``worker`` runs at once at most: its slots on conveyor's worker (conveyor.tasks.releasing), else its threads."""
    return int(getattr(worker, "concurrency", worker.worker_threads))

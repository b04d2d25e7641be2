"""Worker groups: for each queue, processes that each run up to the queue's concurrency in jobs at once.

``conveyor worker`` runs a :class:`Supervisor`: it starts the processes,
restarts any that die, and on SIGTERM/SIGINT tells them to stop taking
jobs, finish what they run (up to ``CONVEYOR_SHUTDOWN_TIMEOUT``), hand
prefetched jobs back, and exit 0. Run more supervisors on more hosts to
scale out: they share the queues through the broker.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Callable

import psutil
import setproctitle

from conveyor.logs import log_error, log_event
from conveyor.tasks import recycling, releasing
from conveyor.tasks.health import Health
from conveyor.tasks.health import serve as serve_health
from conveyor.tasks.watchdog import SELF_FENCE_EXIT, Watchdog

if TYPE_CHECKING:
    from conveyor.app import App

#: A child that dies sooner than this after starting is restarted with a growing delay.
RESTART_BACKOFF_MAX = 30.0

#: Seconds before a self-fenced child (exit code 75, see watchdog.py) is restarted.
SELF_FENCE_RESTART_DELAY = 0.5

#: Seconds between prunes of once-guarded steps (ctx.once) on brokers whose jobs are not Postgres rows
#: (the postgres broker prunes them with their jobs). The retention is days: no need to hurry.
STEPS_PRUNE_INTERVAL = 60.0

#: Seconds between samples of the queue's depth for the dashboard's charts (one per chart point), each
#: followed by a prune of the chart history older than a day (a no-op on Redis, where it expires).
ROLLUP_SAMPLE_INTERVAL = 60.0


class ProcessWorker:
    """One process's Dramatiq worker for one queue, plus the recovery loop for dead workers."""

    def __init__(self, app: App, queue: str, threads: int | None = None) -> None:
        self.app = app
        self.queue = queue
        #: Jobs this process runs at once at most (``threads`` overrides the queue's concurrency).
        self.concurrency = threads or app.queues[queue].concurrency
        #: One per slot, or a few when all the queue's jobs are async (conveyor.tasks.releasing).
        self.threads = releasing.threads_for(app, queue, self.concurrency)
        self.broker = app.broker
        # How often idle consumers and worker threads wake to check for a stop (CONVEYOR_WORKER_IDLE_TIMEOUT).
        idle_ms = int(app.settings.worker_idle_timeout * 1000)
        self.worker = releasing.ReleasingWorker(
            self.broker,
            queues={queue},
            concurrency=self.concurrency,
            worker_threads=self.threads,
            worker_timeout=idle_ms,
        )
        self._stop = threading.Event()
        self._maintainer = threading.Thread(target=self._maintain_loop, name="conveyor-maintain", daemon=True)
        self._watchdog = Watchdog(self.broker, app.settings, queue)
        # Set by the supervisor when it recycles processes (recycling.py): count this process's jobs.
        self._recycle = recycling.current
        if self._recycle is not None:
            self.broker.add_middleware(recycling.JobCounter(self._recycle))

    def start(self) -> None:
        # Without process_boot, Dramatiq's TimeLimit never starts its timer thread.
        self.broker.emit_after("process_boot")
        self.worker.start()
        self._maintainer.start()
        # Runs through most of stop() too: a draining worker cut off from the server must not outlive its lease.
        self._watchdog.start()
        log_event(
            "worker_started",
            queue=self.queue,
            job=None,
            job_id=None,
            attempt=None,
            pid=os.getpid(),
            threads=self.threads,
            concurrency=self.concurrency,
        )

    def stop(self) -> None:
        """Stop taking jobs, let in-flight ones finish, hand prefetched ones back."""
        self._stop.set()
        reason = self._recycle.reason_name if self._recycle is not None else None
        if reason is not None:
            # Counted here, in the drained process's own metrics file: a counter outlives its process.
            from conveyor.middleware.metrics import find_metrics

            metrics = find_metrics(self.broker)
            if metrics is not None:
                metrics.recycled.labels(self.queue, reason).inc()
        self.worker.stop(timeout=int(self.app.settings.shutdown_timeout * 1000))
        self.broker.close()
        # Only now: the drain above is guarded too. A closed broker heartbeats no more, and a
        # ProcessWorker stopped inside a longer-lived process (tests, embedding) must not end it.
        self._watchdog.stop()
        log_event("worker_stopped", queue=self.queue, job=None, job_id=None, attempt=None, pid=os.getpid())

    def _maintain_loop(self) -> None:
        interval = self.app.settings.maintenance_interval
        wait = 0.0  # the first pass at start-up: jobs of workers that died while none ran come back at once
        pruned_at = time.monotonic()
        sampled_at = -ROLLUP_SAMPLE_INTERVAL
        while not self._stop.wait(wait):
            wait = interval
            if time.monotonic() - sampled_at >= ROLLUP_SAMPLE_INTERVAL:
                sampled_at = time.monotonic()
                self._sample_rollup()
            if time.monotonic() - pruned_at >= STEPS_PRUNE_INTERVAL:
                pruned_at = time.monotonic()
                self._prune_steps()
            try:
                recovered = self.broker.maintain()
            except Exception as exc:  # the broker may be down for a while: keep trying
                log_error(f"recovery pass failed: {type(exc).__name__}: {exc}", queue=self.queue)
                continue
            for queue, ids in recovered.items():
                for job_id in ids:
                    log_event(
                        "stalled",
                        level="warning",
                        queue=queue,
                        job=None,
                        job_id=job_id,
                        attempt=None,
                        reason="its worker stopped heartbeating; requeued",
                    )

    def _sample_rollup(self) -> None:
        """The queue's waiting jobs into this minute of the chart history, then old minutes pruned."""
        if self.app.settings.rollup_flush_seconds <= 0:
            return
        from conveyor.brokers.rollup import rollup_store

        try:
            store = rollup_store(self.app)
            store.sample_depth({self.queue: self.broker.queue_counts(self.queue).waiting})
            store.prune()
        except Exception as exc:  # the broker may be down for a while: next minute
            log_error(f"chart history not sampled: {type(exc).__name__}: {exc}", queue=self.queue)

    def _prune_steps(self) -> None:
        """Once-guarded steps older than the retention go (brokers whose jobs live outside Postgres).

        Only when this process has opened the database: its jobs' ``ctx.once`` writes there; a
        process that never did has no steps to prune and must not start an embedded server for it.
        """
        if self.app.capabilities.queue_in_postgres or not self.app.pool_opened:
            return
        from conveyor.tasks import steps

        try:
            with self.app.pool.connection() as conn:
                steps.prune(conn, self.app.settings.retention)
        except Exception as exc:  # the table's migration not applied, Postgres away: next time
            log_error(f"pruning job steps failed: {type(exc).__name__}: {exc}", queue=self.queue)


@dataclass
class _Child:
    """One supervised process: a queue's worker, or a service such as the API."""

    name: str
    target: Callable[..., None]
    args: tuple[object, ...] = ()
    process: BaseProcess | None = None
    started: float = 0.0
    failures: int = 0
    restart_at: float = 0.0
    #: Shared with the running process when the supervisor recycles (recycling.py).
    state: recycling.RecycleState | None = None
    rss_at: float = 0.0
    #: Wall-clock time of the last recycle, until the replacement starts its first job.
    recycled_at: float | None = None


@dataclass
class _Draining:
    """A recycled process finishing its jobs while its replacement already works."""

    name: str
    process: BaseProcess
    deadline: float


class Supervisor:
    """Starts ``processes`` worker processes per queue, plus any ``services``, and keeps them running.

    ``worker(queue, threads)`` is the entry point of each worker process
    (:func:`conveyor.app.run_worker_process`: it builds the process's App).
    ``services`` are ``(name, function, args)`` run in processes of their own
    (``conveyor up`` adds the API and the scheduler this way).
    """

    def __init__(
        self,
        queues: list[str],
        processes: int = 1,
        threads: int | None = None,
        shutdown_timeout: float = 600,
        *,
        worker: Callable[[str, int | None], None],
        metrics_port: int = 0,
        metrics_host: str = "127.0.0.1",
        metrics_dir: str | None = None,
        services: tuple[tuple[str, Callable[..., None], tuple[object, ...]], ...] = (),
        restart_backoff: float = 0.25,
        health_port: int = 0,
        broker_check: Callable[[], None] | None = None,
        max_jobs: int = 0,
        max_memory: int = 0,
        on_worker_died: Callable[[int], None] | None = None,
    ) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        #: Called with the pid of each worker process that died unasked, once reaped, in a thread of
        #: its own (a slow broker must not hold up the restart); see :func:`fleet_reaper`.
        self.on_worker_died = on_worker_died
        self.worker = worker
        self.children = [_Child(q, worker, (q, threads)) for q in queues for _ in range(processes)]
        self.children += [_Child(name, target, args) for name, target, args in services]
        self.shutdown_timeout = shutdown_timeout
        self.restart_backoff = restart_backoff
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.metrics_dir = metrics_dir
        self._stopping = threading.Event()
        self.health_port = health_port
        self.health = Health(broker_check or (lambda: None), self._all_running)
        #: Recycling limits per worker process (0: none): jobs started, resident bytes.
        self.max_jobs = max_jobs
        self.max_memory = max_memory
        self._draining: list[_Draining] = []

    def _all_running(self) -> bool:
        return all(c.process is not None and c.process.is_alive() for c in self.children)

    def run(self) -> int:
        """Run until SIGTERM/SIGINT; returns the exit code (0 after a clean drain)."""
        queues = ",".join(dict.fromkeys(c.name for c in self.children if c.target is self.worker))
        setproctitle.setproctitle(f"conveyor supervisor: {queues or '-'}")
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stopping.set())
        from conveyor.middleware.metrics import WorkerMetrics

        # Before any child starts: they inherit PROMETHEUS_MULTIPROC_DIR, emptied of an earlier run's counts.
        self.metrics = WorkerMetrics(self.metrics_dir)
        if self.metrics_port:
            self.metrics.serve(self.metrics_host, self.metrics_port)
        # /livez and /healthz for Kubernetes' probes (conveyor.tasks.health), on the metrics' address.
        health_server = serve_health(self.health, self.metrics_host, self.health_port) if self.health_port else None
        try:
            return self._supervise()
        finally:
            if health_server is not None:
                health_server.shutdown()
                health_server.server_close()
            self.metrics.close()

    def _supervise(self) -> int:
        for child in self.children:
            self._spawn(child)
        while not self._stopping.wait(0.2):
            self.health.tick()
            now = time.monotonic()
            self._reap_draining(now)
            for child in self.children:
                if self._recycle(child, now):
                    continue
                if child.process is not None and not child.process.is_alive():
                    code = child.process.exitcode
                    child.process.join()
                    self.metrics.process_died(_pid(child.process))
                    if child.target is self.worker and self.on_worker_died is not None:
                        threading.Thread(
                            target=self.on_worker_died, args=(_pid(child.process),), name="conveyor-reaped", daemon=True
                        ).start()
                    child.process = None
                    if code == SELF_FENCE_EXIT:
                        # It lost the server, it did not crash: no crash count, a short pause (the new
                        # process waits at boot until the server answers, it does not spin).
                        delay = SELF_FENCE_RESTART_DELAY
                    else:
                        # A child that lived long was fine before it died: restart at once.
                        child.failures = 0 if now - child.started > 60 else child.failures + 1
                        delay = (
                            0.0
                            if child.failures == 0
                            else min(RESTART_BACKOFF_MAX, self.restart_backoff * 2 ** (child.failures - 1))
                        )
                    child.restart_at = now + delay
                    log_event(
                        "worker_died",
                        level="warning" if code == SELF_FENCE_EXIT else "error",
                        queue=child.name,
                        job=None,
                        job_id=None,
                        attempt=None,
                        exitcode=code,
                        self_fenced=code == SELF_FENCE_EXIT,
                        restart_in_s=round(child.restart_at - now, 2),
                    )
                if child.process is None and now >= child.restart_at:
                    self._spawn(child)
        return self._shutdown()

    def _recycle(self, child: _Child, now: float) -> bool:
        """Drain ``child``'s process and start its replacement when it crossed a limit; True if it did."""
        state, process = child.state, child.process
        if state is None or process is None:
            return False
        if child.recycled_at is not None and state.first_job_at.value:
            # The end of the last recycle: the fresh process's first job.
            log_event(
                "worker_recycle_done",
                queue=child.name,
                job=None,
                job_id=None,
                attempt=None,
                pid=process.pid,
                recycling_s=round(state.first_job_at.value - child.recycled_at, 3),
            )
            child.recycled_at = None
        rss = None
        if self.max_memory and not state.reason.value and now >= child.rss_at:
            child.rss_at = now + recycling.RSS_SAMPLE_INTERVAL
            rss = _rss(process)
            if rss is not None and rss > self.max_memory:
                state.request(recycling.MEMORY)
        if not state.reason.value:
            return False
        if process.is_alive():
            os.kill(_pid(process), signal.SIGTERM)  # the process asked for it (jobs) or not (memory): one drain
        log_event(
            "worker_recycled",
            queue=child.name,
            job=None,
            job_id=None,
            attempt=None,
            pid=process.pid,
            reason=state.reason_name,
            jobs=state.jobs.value,
            rss=rss if rss is not None else _rss(process),
        )
        self._draining.append(_Draining(child.name, process, now + self.shutdown_timeout + 10))
        child.process = None
        child.failures = 0
        child.recycled_at = time.time()
        self._spawn(child)
        return True

    def _reap_draining(self, now: float) -> None:
        """Forget recycled processes that have exited; kill one that outlives its drain."""
        for old in list(self._draining):
            if old.process.is_alive() and now > old.deadline:
                log_error(f"recycled worker process {old.process.pid} did not drain in time: killed", queue=old.name)
                old.process.kill()
            if not old.process.is_alive():
                old.process.join()
                self.metrics.process_died(_pid(old.process))
                self._draining.remove(old)

    def _spawn(self, child: _Child) -> None:
        role = "worker" if child.target is self.worker else "service"
        title = f"conveyor {role}: {child.name}"
        child.state = None
        if child.target is self.worker and (self.max_jobs or self.max_memory):
            child.state = recycling.RecycleState(self.ctx, self.max_jobs)
        child.rss_at = time.monotonic() + recycling.RSS_SAMPLE_INTERVAL
        child.process = self.ctx.Process(
            target=_titled, args=(title, child.target, child.args, child.state), name=f"conveyor-{child.name}"
        )
        child.process.start()
        child.started = time.monotonic()

    def _shutdown(self) -> int:
        self.health.draining = True
        live = [c.process for c in self.children if c.process is not None] + [d.process for d in self._draining]
        for process in live:
            if process.is_alive():
                os.kill(_pid(process), signal.SIGTERM)
        deadline = time.monotonic() + self.shutdown_timeout + 10
        for process in live:
            process.join(max(0.0, deadline - time.monotonic()))
        stuck = [p for p in live if p.is_alive()]
        for process in stuck:
            process.kill()
            process.join()
        for process in live:
            self.metrics.process_died(_pid(process))
        return 1 if stuck else 0


def fleet_reaper(app: App) -> Callable[[int], None] | None:
    """What the supervisor calls when it reaps a worker process that died unasked: mark its registry entry gone.

    Without it a SIGKILLed process stays *late* on the Workers page until its heartbeat ages past
    the recovery time (a minute), though its supervisor saw it die at once. Its jobs are left to
    the broker's lease recovery, fenced as ever: the process is dead, so it can neither ack nor
    beat again. None on the inline broker (no supervisor runs it).
    """
    from conveyor.brokers.fleet import mark_process_gone, store_without_broker

    store = store_without_broker(app)
    if store is None:
        return None
    host = socket.gethostname()  # as the worker's Fleet middleware names itself

    def reaped(pid: int) -> None:
        try:
            marked = mark_process_gone(store, host, pid)
        except Exception as exc:  # the broker may be down: the sweep marks it gone later
            log_error(f"marking dead worker process {pid} gone failed: {type(exc).__name__}: {exc}", queue=None)
            return
        for worker_id in marked:
            log_event("worker_marked_gone", queue=None, job=None, job_id=None, attempt=None, pid=pid, worker=worker_id)

    return reaped


def _titled(
    title: str, target: Callable[..., None], args: tuple[object, ...], state: recycling.RecycleState | None = None
) -> None:
    """A child's entry point: name the process for ps and top (not ``python -c from multiprocessing...``), then run.

    ``state``: the recycling state the supervisor shares with a worker process, left where its
    :class:`ProcessWorker` finds it.
    """
    setproctitle.setproctitle(title)
    recycling.current = state
    target(*args)


def _rss(process: BaseProcess) -> int | None:
    """The process's resident memory in bytes; None once it is gone."""
    try:
        return int(psutil.Process(_pid(process)).memory_info().rss)
    except psutil.Error:
        return None


def _pid(process: BaseProcess) -> int:
    """A started process's pid (it is None only before ``start()``, and every child here was started)."""
    assert process.pid is not None
    return process.pid


class InlineWorkers:
    """The inline broker's workers: one Dramatiq worker per queue inside this process."""

    def __init__(self, app: App, queues: list[str] | None = None) -> None:
        self.app = app
        self.broker = app.broker
        self.workers = [
            releasing.ReleasingWorker(
                self.broker,
                queues={q},
                concurrency=app.queues[q].concurrency,
                worker_threads=releasing.threads_for(app, q, app.queues[q].concurrency),
                worker_timeout=100,
            )
            for q in (queues or list(app.queues))
        ]

    def start(self) -> "InlineWorkers":
        self.broker.emit_after("process_boot")
        for worker in self.workers:
            worker.start()
        return self

    def join(self) -> None:
        """Wait until every queue is drained (delays included)."""
        for worker in self.workers:
            worker.join()

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop(timeout=int(self.app.settings.shutdown_timeout * 1000))

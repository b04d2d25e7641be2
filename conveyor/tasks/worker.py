"""Worker groups: for each queue, processes whose thread count is the queue's concurrency.

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
import threading
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Callable

import setproctitle
from dramatiq import Worker

from conveyor.logs import log_error, log_event
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


class ProcessWorker:
    """One process's Dramatiq worker for one queue, plus the recovery loop for dead workers."""

    def __init__(self, app: App, queue: str, threads: int | None = None) -> None:
        self.app = app
        self.queue = queue
        self.threads = threads or app.queues[queue].concurrency
        self.broker = app.broker
        # How often idle consumers and worker threads wake to check for a stop (CONVEYOR_WORKER_IDLE_TIMEOUT).
        idle_ms = int(app.settings.worker_idle_timeout * 1000)
        self.worker = Worker(self.broker, queues={queue}, worker_threads=self.threads, worker_timeout=idle_ms)
        self._stop = threading.Event()
        self._maintainer = threading.Thread(target=self._maintain_loop, name="conveyor-maintain", daemon=True)
        self._watchdog = Watchdog(self.broker, app.settings, queue)

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
        )

    def stop(self) -> None:
        """Stop taking jobs, let in-flight ones finish, hand prefetched ones back."""
        self._stop.set()
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
        while not self._stop.wait(wait):
            wait = interval
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

    def _prune_steps(self) -> None:
        """Once-guarded steps older than the retention go (brokers whose jobs live outside Postgres).

        Only when this process has opened the database: its jobs' ``ctx.once`` writes there; a
        process that never did has no steps to prune and must not start an embedded server for it.
        """
        if self.app.settings.broker_name == "postgres" or not self.app.pool_opened:
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
    ) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self.worker = worker
        self.children = [_Child(q, worker, (q, threads)) for q in queues for _ in range(processes)]
        self.children += [_Child(name, target, args) for name, target, args in services]
        self.shutdown_timeout = shutdown_timeout
        self.restart_backoff = restart_backoff
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.metrics_dir = metrics_dir
        self._stopping = threading.Event()

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
        try:
            return self._supervise()
        finally:
            self.metrics.close()

    def _supervise(self) -> int:
        for child in self.children:
            self._spawn(child)
        while not self._stopping.wait(0.2):
            now = time.monotonic()
            for child in self.children:
                if child.process is not None and not child.process.is_alive():
                    code = child.process.exitcode
                    child.process.join()
                    self.metrics.process_died(_pid(child.process))
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

    def _spawn(self, child: _Child) -> None:
        role = "worker" if child.target is self.worker else "service"
        title = f"conveyor {role}: {child.name}"
        child.process = self.ctx.Process(
            target=_titled, args=(title, child.target, child.args), name=f"conveyor-{child.name}"
        )
        child.process.start()
        child.started = time.monotonic()

    def _shutdown(self) -> int:
        live = [c.process for c in self.children if c.process is not None]
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


def _titled(title: str, target: Callable[..., None], args: tuple[object, ...]) -> None:
    """A child's entry point: name the process for ps and top (not ``python -c from multiprocessing...``), then run."""
    setproctitle.setproctitle(title)
    target(*args)


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
            Worker(self.broker, queues={q}, worker_threads=app.queues[q].concurrency, worker_timeout=100)
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

"""Worker recycling: a process that has started enough jobs, or grown too big, is drained and replaced.

``conveyor worker --max-jobs-per-process N --max-memory-per-process 512MiB``
(Celery's ``max_tasks_per_child`` / ``max_memory_per_child``). The
supervisor gives each worker process a :class:`RecycleState` in shared
memory. The process counts the jobs it starts there
(:class:`JobCounter`); the one that starts job N asks for the recycle
itself, at once, so a process never starts more than N + threads - 1 jobs
(each other thread may already hold one more message when the stop
lands). The supervisor samples each process's resident memory every
:data:`RSS_SAMPLE_INTERVAL` and asks for a recycle above the limit.

Either way the process is stopped by the path a SIGTERM takes
(:meth:`~conveyor.tasks.worker.ProcessWorker.stop`): running jobs finish
(up to ``CONVEYOR_SHUTDOWN_TIMEOUT``), prefetched ones go back to the
broker unstarted. The supervisor starts the replacement at once, while the
old one drains: the queue keeps its throughput, at the price of one extra
process for the length of the drain. A recycle is no crash: no backoff.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from multiprocessing.context import SpawnContext
from typing import Callable

from dramatiq import Broker, Middleware
from dramatiq.broker import MessageProxy
from dramatiq.worker import WorkerThread

#: Seconds between two samples of a worker process's resident memory by the supervisor.
RSS_SAMPLE_INTERVAL = 1.0

#: Why a process was recycled: the code kept in :attr:`RecycleState.reason`, and its label.
REASONS = {1: "jobs", 2: "memory"}
JOBS, MEMORY = 1, 2


class RecycleState:
    """What a worker process and its supervisor share (``multiprocessing.Value``s, created per spawn)."""

    def __init__(self, ctx: SpawnContext, max_jobs: int) -> None:
        #: The jobs the process has started (counted before each runs).
        self.jobs = ctx.Value("q", 0)
        #: 0 while the process works; a key of :data:`REASONS` once its recycle was asked for.
        self.reason = ctx.Value("i", 0)
        #: Wall-clock time of the process's first job (0.0 before it): the end of a recycle.
        self.first_job_at = ctx.Value("d", 0.0)
        self.max_jobs = max_jobs

    def request(self, reason: int) -> bool:
        """Ask for the recycle; True for the first asker only (the process and its supervisor may race)."""
        with self.reason.get_lock():
            if self.reason.value:
                return False
            self.reason.value = reason
            return True

    @property
    def reason_name(self) -> str | None:
        return REASONS.get(self.reason.value)


#: The state the supervisor handed this process (set in the child before its worker is built; None elsewhere).
current: RecycleState | None = None


class JobCounter(Middleware):
    """Counts the jobs this process starts; at the limit, stops taking more and asks for the recycle.

    The thread that starts job N stops its own loop after that job
    (``WorkerThread.stop``, as ``Worker.stop`` does) and sends the process
    the SIGTERM its supervisor would: the ordinary drain follows. A thread
    that starts a job past the limit before that drain reaches it stops
    after that one job too, so no thread starts two past the limit.
    """

    def __init__(self, state: RecycleState, on_limit: Callable[[], None] | None = None) -> None:
        self.state = state
        #: How the process is told to drain: the SIGTERM its supervisor would send (tests pass their own).
        self.on_limit = on_limit or _terminate_self
        self._asked = False

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        state = self.state
        with state.jobs.get_lock():
            state.jobs.value += 1
            started = state.jobs.value
        if started == 1:
            state.first_job_at.value = time.time()
        if not state.max_jobs or started < state.max_jobs:
            return
        thread = threading.current_thread()
        if isinstance(thread, WorkerThread):
            thread.stop()
        if not self._asked:
            self._asked = True
            state.request(JOBS)
            self.on_limit()


def _terminate_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)

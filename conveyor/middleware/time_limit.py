"""Dramatiq's time limit, raised through :mod:`conveyor.interrupts`: never inside a pool's checkout or return.

Dramatiq's own manager raises ``TimeLimitExceeded`` in the job's thread
wherever it runs; this one asks :func:`conveyor.interrupts.interrupt`, which
defers it while the thread checks a connection out of a pool or returns one
(so a long-lived worker never loses its pool to its time limits), and every
job starts and ends with no interrupt left over from the one before.
"""

from __future__ import annotations

import threading
from time import monotonic, sleep
from typing import Any

from dramatiq import Broker
from dramatiq.broker import MessageProxy
from dramatiq.middleware import TimeLimit as DramatiqTimeLimit
from dramatiq.middleware.time_limit import TimeLimitExceeded
from dramatiq.threading import is_gevent_active

from conveyor import interrupts


class TimeLimit(DramatiqTimeLimit):
    """Dramatiq's ``TimeLimit`` (same options: ``time_limit`` per actor or message, in ms) with a shielded raise."""

    def __init__(self, *, time_limit: float = 600000, interval: int = 1000) -> None:
        super().__init__(time_limit=time_limit, interval=interval)
        if not is_gevent_active():  # type: ignore[no-untyped-call]
            self.manager = _Deadlines(interval / 1000, self.logger)  # type: ignore[assignment]

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        interrupts.reset()
        super().before_process_message(broker, message)  # type: ignore[no-untyped-call]

    def after_process_message(
        self, broker: Broker, message: MessageProxy, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        super().after_process_message(broker, message, result=result, exception=exception)  # type: ignore[no-untyped-call]
        interrupts.reset()

    after_skip_message = after_process_message

    def after_release_message(self, broker: Broker, message: MessageProxy, run: Any) -> None:
        """An async job let go by its worker thread (conveyor.tasks.releasing): its deadline moves to its coroutine.

        Called shielded (no interrupt lands in the thread meanwhile): the thread's deadline is taken away,
        and ``run`` (an :class:`~conveyor.tasks.aio.AsyncRun`) is cancelled at it instead. One already due
        and raised is deferred by the shield; the releasing thread hands it to the run.
        """
        if not isinstance(self.manager, _Deadlines):
            return
        deadline = self.manager.take(threading.get_ident())
        if deadline is not None:
            run.interrupt_at(deadline, TimeLimitExceeded)


class _Deadlines(threading.Thread):
    """The job threads' deadlines, checked every ``interval`` s (Dramatiq's ctypes manager, shielded)."""

    def __init__(self, interval: float, logger: Any) -> None:
        super().__init__(daemon=True, name="conveyor-time-limit")
        self.interval = interval
        self.logger = logger
        self.deadlines: dict[int, float | None] = {}
        self.mu = threading.Lock()

    def add_timeout(self, thread_id: int, ttl: float) -> None:
        with self.mu:
            self.deadlines[thread_id] = monotonic() + ttl / 1000

    def remove_timeout(self, thread_id: int) -> None:
        with self.mu:
            self.deadlines[thread_id] = None

    def take(self, thread_id: int) -> float | None:
        """The thread's deadline (``monotonic()``), now no longer the thread's; None if it has none."""
        with self.mu:
            deadline = self.deadlines.get(thread_id)
            self.deadlines[thread_id] = None
        return deadline

    def run(self) -> None:
        while True:
            now = monotonic()
            with self.mu:
                due = [t for t, deadline in self.deadlines.items() if deadline is not None and now >= deadline]
                for thread_id in due:
                    self.deadlines[thread_id] = None
            for thread_id in due:
                self.logger.warning("Time limit exceeded. Raising exception in worker thread %r.", thread_id)
                try:
                    interrupts.interrupt(thread_id, TimeLimitExceeded)
                except Exception:  # pragma: no cover - a thread that is gone
                    self.logger.exception("could not interrupt worker thread %r", thread_id)
            sleep(self.interval)

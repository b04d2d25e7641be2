"""Cancel a running job anywhere: ``ctx.cancelled`` at once, an interrupt after the grace, the hook, the outcome.

A cancellation is stored by the broker (``ConveyorBroker.cancel_job``); a job
no worker has started yet ends ``cancelled`` at its start (the broker's start
does it, fenced), so it never runs. For a job a worker runs, this middleware
keeps the process's running jobs (:class:`Cancels`, one per App, which
``ctx.cancelled`` reads), and one thread per worker process that hears the
broker's cancel channel (Redis pub/sub, Postgres ``LISTEN``), with a slow poll
behind it in case a wake-up was lost. When a running job's cancellation
arrives it is marked (``ctx.cancelled`` turns True at once); if it still runs
after ``CONVEYOR_CANCEL_GRACE_SECONDS`` its thread is interrupted with
:class:`~conveyor.interrupts.JobCancelled` through :mod:`conveyor.interrupts`
(never inside a pool's checkout or return, like the time limit). When the run
ends, however it ended, the broker writes the ``cancelled`` outcome fenced
like an ack, and only if that write ended the job does the job type's
``on_cancel`` hook run, once: a superseded delivery's outcome is refused and
runs no hook, and one that could not be written leaves the job held (never
completed by its ack), so its next start ends it cancelled, without the hook.
The retries, the failure hooks and the webhook never see it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dramatiq import Broker, Worker
from dramatiq.broker import MessageProxy

from conveyor import interrupts
from conveyor.brokers.base import CANCELLED, CancelListener, log_delivery_error
from conveyor.logs import log_event
from conveyor.middleware.base import ConveyorMiddleware, conveyor_broker

if TYPE_CHECKING:
    from conveyor.app import App

#: Seconds between the watcher's checks of the running jobs' stored cancellations behind the wake-up
#: channel (a notification lost while its connection was down). Without a channel: POLL_NO_CHANNEL.
POLL_SECONDS = 5.0
#: The poll when the broker has no channel here (a transaction-mode pooler without a listen URL): it is
#: then the only way a cancel arrives, and half a second keeps the 1 s promise at one small read a tick.
POLL_NO_CHANNEL = 0.5
#: Seconds the watcher sleeps between looks at deadlines: an interrupt is due at most this late.
TICK = 0.05
#: Seconds a cancellation heard for a job not (yet) registered here is remembered: the gap between a
#: delivery's start (where a stored cancel ends it) and its registration is far shorter.
REMEMBER_SECONDS = 10.0


@dataclass
class _Run:
    thread_id: int
    message: MessageProxy
    cancelled: threading.Event = field(default_factory=threading.Event)
    interrupt_at: float | None = None
    interrupted: bool = False
    #: An async job let go by its thread (conveyor.tasks.releasing): the interrupt cancels its coroutine.
    released: Any = None


class Cancels:
    """The jobs this process runs, and which of them were cancelled (``ctx.cancelled`` reads it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: dict[str, _Run] = {}
        self.recent: dict[str, float] = {}

    def is_cancelled(self, job_id: str) -> bool:
        run = self.running.get(job_id)
        return run is not None and run.cancelled.is_set()

    def asked(self, job_id: str, grace: float) -> None:
        """The cancellation of ``job_id`` was heard: mark it, and set its interrupt a grace from now."""
        with self.lock:
            run = self.running.get(job_id)
            if run is None:
                self.recent[job_id] = time.monotonic()
                return
            if run.cancelled.is_set():
                return
            run.cancelled.set()
            run.interrupt_at = time.monotonic() + grace
        log_event(
            "cancelling",
            queue=run.message.queue_name,
            job=run.message.actor_name,
            job_id=job_id,
            attempt=run.message.options.get("attempt"),
            grace_s=grace,
        )


class Cancellation(ConveyorMiddleware):
    """Hears cancellations of the jobs this process runs and ends them (see the module docstring)."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.cancels = app.cancels
        self.grace = app.settings.cancel_grace_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- a delivery's life -------------------------------------------------------

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        run = _Run(threading.get_ident(), message)
        with self.cancels.lock:
            self.cancels.running[message.message_id] = run
            heard = self.cancels.recent.pop(message.message_id, None) is not None
        if heard:
            self.cancels.asked(message.message_id, self.grace)

    def after_process_message(
        self, broker: Broker, message: MessageProxy, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        with self.cancels.lock:  # no interrupt is raised for it from here on
            run = self.cancels.running.pop(message.message_id, None)
        if run is None or not run.cancelled.is_set():
            return
        interrupts.reset()  # one set but not yet delivered lands nowhere
        owner = conveyor_broker(broker)
        if owner.completed_in_own_transaction(message):
            # Its transaction (ctx.transaction, ctx.complete_in) committed the job done before the cancel could end it: like
            # a cancel of a job that had ended, nothing changes, and the hook (for jobs that end cancelled)
            # does not run: it would undo what the job committed.
            log_event(
                "cancelled",
                queue=message.queue_name,
                job=message.actor_name,
                job_id=message.message_id,
                attempt=message.options.get("attempt"),
                interrupted=run.interrupted,
                written=False,
                reason="completed in its own transaction before the cancel: left done",
            )
            return
        # Whatever the body did after the cancel (stopped, returned, raised): the job ends cancelled, neither
        # retried nor failed. The broker decides first, fenced; the hook runs only if the cancel won there.
        message.options[CANCELLED] = True
        why = "JobCancelled: interrupted after the grace" if run.interrupted else "JobCancelled: stopped"
        try:
            ended = owner.cancel_outcome(message, why)
        except Exception as exc:
            # Not written, or not known to be: keep the job held (its ack must not complete it); it comes back
            # and its next start ends it cancelled (the cancellation is stored). The hook does not run: the
            # outcome was not decided here, and a hook must never run for a job that ends otherwise.
            owner.leave_unsettled(message, f"cancel outcome not written: {type(exc).__name__}")
            return
        if ended:
            self.app.cancel_hook(message)
        # Not ended: refused (a superseded delivery, the job gone); whoever holds it now decides its end.
        log_event(
            "cancelled",
            queue=message.queue_name,
            job=message.actor_name,
            job_id=message.message_id,
            attempt=message.options.get("attempt"),
            interrupted=run.interrupted,
            written=ended,
        )

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        with self.cancels.lock:
            self.cancels.running.pop(message.message_id, None)

    def after_release_message(self, broker: Broker, message: MessageProxy, run: Any) -> None:
        """An async job let go by its worker thread: its interrupt, from now on, cancels its coroutine.

        Called shielded: an interrupt sent to the thread before this is deferred, and the releasing
        thread hands it to ``run`` (an :class:`~conveyor.tasks.aio.AsyncRun`).
        """
        with self.cancels.lock:
            job = self.cancels.running.get(message.message_id)
            if job is not None:
                job.released = run

    # -- the watcher -------------------------------------------------------------

    def after_worker_boot(self, broker: Broker, worker: Worker) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, args=(conveyor_broker(broker),), name="conveyor-cancel", daemon=True
            )
            self._thread.start()

    def after_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        # After the drain: a job still finishing can be cancelled until it ends.
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=2)

    def _run(self, broker: Any) -> None:
        listener: CancelListener | None = None
        has_channel = True
        reconnect_at = 0.0
        next_poll = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if listener is None and has_channel and now >= reconnect_at:
                try:
                    listener = broker.cancel_listener()
                    has_channel = listener is not None
                    next_poll = now  # anything asked while it was away
                except Exception as exc:
                    reconnect_at = now + 1.0
                    log_event(
                        "error",
                        level="warning",
                        queue=None,
                        job=None,
                        job_id=None,
                        attempt=None,
                        error=f"cancel channel unavailable: {type(exc).__name__}",
                    )
            heard: list[str] = []
            if listener is not None:
                try:
                    heard = listener.wait(TICK)
                except Exception as exc:
                    log_event(
                        "error",
                        level="warning",
                        queue=None,
                        job=None,
                        job_id=None,
                        attempt=None,
                        error=f"cancel channel lost: {type(exc).__name__}",
                    )
                    _close(listener)
                    listener, reconnect_at, next_poll = None, now + 0.5, now
            else:
                self._stop.wait(TICK)
            now = time.monotonic()
            with self.cancels.lock:
                running = list(self.cancels.running)
                self.cancels.recent = {k: t for k, t in self.cancels.recent.items() if now - t < REMEMBER_SECONDS}
            if running and now >= next_poll:
                next_poll = now + (POLL_SECONDS if listener is not None else POLL_NO_CHANNEL)
                try:
                    heard += sorted(broker.cancel_requested(running))
                except Exception as exc:
                    log_event(
                        "error",
                        level="warning",
                        queue=None,
                        job=None,
                        job_id=None,
                        attempt=None,
                        error=f"cancel poll failed: {type(exc).__name__}",
                    )
            for job_id in heard:
                self.cancels.asked(job_id, self.grace)
            self._interrupt_due()
        if listener is not None:
            _close(listener)

    def _interrupt_due(self) -> None:
        now = time.monotonic()
        with self.cancels.lock:
            for run in self.cancels.running.values():
                if run.interrupt_at is not None and not run.interrupted and now >= run.interrupt_at:
                    run.interrupted = True
                    try:
                        if run.released is not None:
                            run.released.interrupt_with(interrupts.JobCancelled)
                        else:
                            interrupts.interrupt(run.thread_id, interrupts.JobCancelled)
                    except Exception as exc:  # pragma: no cover - a thread that is gone
                        log_delivery_error(run.message, f"could not interrupt the cancelled job: {exc!r}")


def _close(listener: CancelListener) -> None:
    try:
        listener.close()
    except Exception:
        pass

"""Conveyor's worker: Dramatiq's, except that an async job holds no worker thread while it awaits.

Dramatiq's :class:`~dramatiq.worker.WorkerThread` runs a message from its
``before_process_message`` hooks to its ack: an ``async def`` processor
would hold the thread for as long as its coroutine awaits. Here the
worker thread runs the job's synchronous part (the hooks, the fenced
start among them, the payload, the budgets' admission), starts the
coroutine on the App's loop (:class:`conveyor.tasks.aio.AsyncRun`), tells
the middleware it let the message go (``after_release_message``: the time
limit's deadline and the cancel's interrupt move from the thread to the
coroutine, the trace's context leaves the thread), and takes the next
message. When the coroutine ends, one of a few *finisher* threads runs
what :meth:`WorkerThread.process_message` would have run after the actor
returned, in the same order: the result's store, the
``after_process_message`` chain with the result or the exception, the
consumer's ``post_process_message`` (the fenced ack or nack, retried while
the broker is away), the work queue's ``task_done``.

What bounds the jobs in flight per process is the queue's concurrency,
counted as *slots*: a worker thread takes a slot before it takes a
message; a sync job gives it back when its thread is done with it, an
async job when its finisher is. A queue whose jobs are all ``async def``
runs on :data:`ASYNC_THREADS` threads (they only start and hand off), so
a queue of concurrency 100 has 100 coroutines awaiting on a handful of
threads; a queue with a sync job keeps a thread per slot. The consumer's
prefetch is twice the slots, as Dramatiq's is twice the threads.

On a stop, the worker threads stop taking messages, then the released
coroutines get what is left of the shutdown timeout to end and be acked;
the consumers (and the broker's heartbeats) run until then. A coroutine
still running after it is left held, never acked: like a sync job past
the timeout, it is recovered as after a kill, once the process is gone.
"""

from __future__ import annotations

import logging
import queue as std_queue
import threading
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from dramatiq import Broker, Worker
from dramatiq.common import iter_queue, join_all
from dramatiq.errors import BrokerConnectionError, RateLimitExceeded, Retry
from dramatiq.middleware import SkipMessage
from dramatiq.worker import DELAY_QUEUE_PREFETCH, QUEUE_PREFETCH, WorkerThread, has_results_middleware

from conveyor import interrupts
from conveyor.tasks import aio

if TYPE_CHECKING:
    from dramatiq.broker import MessageProxy

    from conveyor.app import App

#: Worker threads of a queue whose jobs are all async: they start jobs and hand them off, no more.
ASYNC_THREADS = 4

#: Finisher threads per worker: they run the ends of async jobs (hooks, ack), a few round trips each.
FINISHERS = 4

logger = logging.getLogger("conveyor.worker")


def threads_for(app: App, queue: str, concurrency: int) -> int:
    """Worker threads for ``queue``: one per slot, or :data:`ASYNC_THREADS` when all its jobs are async."""
    kinds = [aio.is_async(t.run) for t in app.job_types.values() if t.queue == queue]
    if kinds and all(kinds):
        return max(1, min(concurrency, ASYNC_THREADS))
    return concurrency


class ReleasingWorker(Worker):
    """A Dramatiq worker whose threads let an async job go while it awaits (see the module docstring)."""

    def __init__(
        self, broker: Broker, *, queues: set[str], concurrency: int, worker_threads: int, worker_timeout: int
    ) -> None:
        super().__init__(broker, queues=queues, worker_threads=worker_threads, worker_timeout=worker_timeout)
        #: Jobs in flight at most (sync and async together): the queue's concurrency.
        self.concurrency = concurrency
        # Dramatiq's rule (its environment's override, else twice the threads), counted in slots.
        self.queue_prefetch = QUEUE_PREFETCH or min(concurrency * 2, 65535)
        self.delay_prefetch = DELAY_QUEUE_PREFETCH or min(concurrency * 1000, 65535)
        self.slots = threading.BoundedSemaphore(concurrency)
        #: id(message) -> (message, its run) for every async job let go and not finished yet.
        self.released: dict[int, tuple[MessageProxy, aio.AsyncRun]] = {}
        self._released_changed = threading.Condition()
        self._ends: std_queue.SimpleQueue[tuple[MessageProxy, aio.Released, aio.AsyncRun] | None] = (
            std_queue.SimpleQueue()
        )
        self._finishers: list[threading.Thread] = []
        #: Set when a stop gave up on released jobs: they stay held (recovered), nothing acks them late.
        self.abandoned = False

    def _add_worker(self) -> None:
        worker = ReleasingWorkerThread(
            owner=self,
            broker=self.broker,
            consumers=self.consumers,
            work_queue=self.work_queue,
            worker_timeout=self.worker_timeout,
        )
        worker.start()
        self.workers.append(worker)

    def start(self) -> None:
        for n in range(min(FINISHERS, self.concurrency)):
            finisher = threading.Thread(target=self._finish_loop, name=f"conveyor-finisher-{n}", daemon=True)
            finisher.start()
            self._finishers.append(finisher)
        super().start()

    # -- async jobs ------------------------------------------------------------------

    def release(self, message: MessageProxy, released: aio.Released) -> aio.AsyncRun:
        """Start ``released`` on the loop; its end is handed to a finisher. Called in the worker thread."""
        with self._released_changed:
            run = released.start(lambda r: self._ends.put((message, released, r)))
            self.released[id(message)] = (message, run)
        return run

    def _finish_loop(self) -> None:
        while True:
            item = self._ends.get()
            if item is None:
                return
            try:
                self._finish(*item)
            except BaseException:  # a finisher must outlive any one job's end
                logger.exception("finishing an async job failed")

    def _finish(self, message: MessageProxy, released: aio.Released, run: aio.AsyncRun) -> None:
        """What WorkerThread.process_message runs after the actor returned, for an async job that ended."""
        if self.abandoned:
            # The stop gave up waiting and closed the consumers: the job stays held, recovered as after a kill.
            logger.warning("async job %s ended after the drain gave up on it: left to recovery", message.message_id)
            return
        try:
            try:
                value = run.outcome.result()
                released.finish(value)
            except SkipMessage as e:
                if message.failed:
                    message.stuff_exception(e)
                self.broker.emit_after("skip_message", message)
            except BaseException as e:
                message.stuff_exception(e)
                _log_failure(self.broker, message, e)
                self.broker.emit_after("process_message", message, exception=e)
            else:
                self.broker.emit_after("process_message", message, result=None)
        finally:
            try:
                self.consumers[message.queue_name].post_process_message(message)
                self.work_queue.task_done()
                message.clear_exception()
            finally:
                with self._released_changed:
                    self.released.pop(id(message), None)
                    self._released_changed.notify_all()
                self.slots.release()

    def in_flight_released(self) -> int:
        with self._released_changed:
            return len(self.released)

    # -- stop -------------------------------------------------------------------------

    def stop(self, timeout: int = 600000) -> None:
        """Dramatiq's ``Worker.stop``, plus: released async jobs finish (or are left held) before the consumers stop."""
        deadline = time.monotonic() + timeout / 1000
        self.broker.emit_before("worker_shutdown", self)
        self.logger.info("Shutting down...")
        for thread in self.workers:
            thread.stop()
        join_all(self.workers, timeout)  # type: ignore[no-untyped-call]
        # The consumers keep running meanwhile: their broker's heartbeats keep these jobs' leases.
        with self._released_changed:
            while self.released and time.monotonic() < deadline:
                self._released_changed.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            left = len(self.released)
            if left:
                self.abandoned = True
        if left:
            logger.warning("%d async job(s) still running after the shutdown timeout: left held, recovered", left)
        for _ in self._finishers:
            self._ends.put(None)
        for consumer in self.consumers.values():
            consumer.stop()
        join_all(self.consumers.values(), timeout)  # type: ignore[no-untyped-call]
        messages_by_queue = defaultdict(list)
        for item in iter_queue(self.work_queue):  # type: ignore[no-untyped-call]
            messages_by_queue[item.message.queue_name].append(item.message)
        for queue_name, messages in messages_by_queue.items():
            try:
                self.consumers[queue_name].requeue_messages(messages)
            except BrokerConnectionError:
                self.logger.warning("Failed to requeue messages on queue %r.", queue_name, exc_info=True)
        for consumer in self.consumers.values():
            consumer.close()
        self.broker.emit_after("worker_shutdown", self)
        self.logger.info("Worker has been shut down.")


class ReleasingWorkerThread(WorkerThread):
    """Takes a slot, then a message; an async job's slot goes back when its finisher is done with it."""

    def __init__(self, *, owner: ReleasingWorker, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.owner = owner

    def run(self) -> None:
        aio.mark_releasing()
        self.running = True
        self.broker.emit_after("worker_thread_boot", self)
        while self.running:
            if self.paused:
                self.paused_event.set()
                time.sleep(self.timeout)
                continue
            if not self.owner.slots.acquire(timeout=self.timeout):
                continue
            try:
                item = self.work_queue.get(timeout=self.timeout)
            except std_queue.Empty:
                self.owner.slots.release()
                continue
            released = False
            try:
                released = self.process_one(item.message)
            finally:
                if not released:
                    self.owner.slots.release()
        self.broker.emit_before("worker_thread_shutdown", self)

    def process_one(self, message: MessageProxy) -> bool:
        """Dramatiq's ``process_message``; True when the message was let go to the loop (a finisher ends it)."""
        actor = None
        res: Any = None
        run: aio.AsyncRun | None = None
        try:
            self.broker.emit_before("process_message", message)
            if not message.failed:
                actor = self.broker.get_actor(message.actor_name)
                res = actor(*message.args, **message.kwargs)
                if isinstance(res, aio.Released):
                    run = self._release(message, res)
                    return True
                if (
                    res is not None
                    and message.options.get("pipe_target") is None
                    and not has_results_middleware(self.broker)
                ):
                    self.logger.warning("Actor %r returned a value no Results middleware takes.", actor.actor_name)
            self.broker.emit_after("process_message", message, result=res)
        except SkipMessage as e:
            if message.failed:
                message.stuff_exception(e)
            self.logger.warning("Message %s was skipped.", message)
            self.broker.emit_after("skip_message", message)
        except BaseException as e:
            if isinstance(res, aio.Released) and run is None:
                res.discard()  # interrupted before its start: it never ran
            message.stuff_exception(e)
            _log_failure(self.broker, message, e, actor)
            self.broker.emit_after("process_message", message, exception=e)
        finally:
            if run is None:
                self.consumers[message.queue_name].post_process_message(message)
                self.work_queue.task_done()
                message.clear_exception()
        return False

    def _release(self, message: MessageProxy, released: aio.Released) -> aio.AsyncRun:
        """Start the coroutine and move the job's interrupts to it, shielded: none lands in this thread after."""
        interrupts.enter_shield()  # one set on this thread and not delivered yet is taken back, kept for the run
        try:
            try:
                run = self.owner.release(message, released)
            except BaseException:
                released.discard()
                raise
            for middleware in self.broker.middleware:
                hook = getattr(middleware, "after_release_message", None)
                if hook is not None:
                    try:
                        hook(self.broker, message, run)
                    except Exception:
                        self.logger.exception("after_release_message of %r failed", middleware)
        finally:
            pending = interrupts.leave_shield()
            interrupts.reset()
        if pending is not None:
            run.interrupt_with(pending)  # its time limit or cancel came while it started: it ends at once
        return run


def _log_failure(broker: Broker, message: MessageProxy, e: BaseException, actor: Any = None) -> None:
    """Dramatiq's log line for a failed message (WorkerThread.process_message)."""
    if actor is None:
        try:
            actor = broker.get_actor(message.actor_name)
        except Exception:
            actor = None
    throws = message.options.get("throws") or (actor and actor.options.get("throws"))
    if isinstance(e, RateLimitExceeded):
        logger.debug("Rate limit exceeded in message %s: %s.", message, e)
    elif throws and isinstance(e, throws):
        logger.info("Failed to process message %s with expected exception %s.", message, type(e).__name__)
    elif not isinstance(e, Retry):
        logger.error("Failed to process message %s with unhandled exception.", message, exc_info=e)

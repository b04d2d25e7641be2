"""Async jobs: an ``async def`` processor runs on the App's event loop, and holds no worker thread while it awaits.

The loop is Dramatiq 2.x's :class:`~dramatiq.asyncio.EventLoopThread`,
started on the first async job and stopped by ``App.close()``.

On conveyor's worker (:mod:`conveyor.tasks.releasing`, every ``conveyor
worker`` process and the inline broker's workers) the worker thread that
took the message does the job's synchronous part (its start and the other
``before_process_message`` hooks, the payload, the budgets' admission),
hands the coroutine to the loop as an :class:`AsyncRun`, and goes back to
take the next message. When the coroutine ends, a finisher thread runs
what Dramatiq would have run in the worker thread: the result's store,
the ``after_process_message`` chain and the ack or nack. What bounds the
async jobs in flight is the queue's concurrency, counted as slots
(``conveyor.tasks.releasing``), not the threads.

The time limit and the cancel's interrupt end an :class:`AsyncRun` on the
loop: its task is cancelled (``CancelledError`` at its ``await``; its
``finally`` blocks run) and the attempt fails with the interrupt
(``TimeLimitExceeded``, ``JobCancelled``), even if the coroutine swallowed
the cancellation; one that has not ended :data:`CANCEL_GRACE` seconds
after its cancel is left to run on, and the attempt ends without it.

Anywhere else (a plain Dramatiq worker thread, a direct call) the calling
thread waits for the coroutine (:func:`run_async`): the time limit, raised
in that thread, cancels it.

The coroutines share one thread: a job that blocks (a sync database
call, ``time.sleep``) blocks every async job of the process; use
``asyncio.to_thread`` for those.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from dramatiq.asyncio import EventLoopThread

if TYPE_CHECKING:
    from conveyor.app import App

T = TypeVar("T")

#: Seconds the loop gets to start; it starts in microseconds, so this only catches a broken interpreter.
LOOP_START_TIMEOUT = 5.0

#: Seconds a cancelled coroutine (time limit, cancel) gets to end before its attempt ends without it.
CANCEL_GRACE = 1.0

logger = logging.getLogger("conveyor.aio")


def is_async(fn: Any) -> bool:
    """Whether ``fn`` is an ``async def`` processor (a coroutine function)."""
    return inspect.iscoroutinefunction(fn)


class EventLoop:
    """The App's event loop thread, started on first use; ``close()`` stops it (an App resource)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: EventLoopThread | None = None

    def loop_thread(self) -> EventLoopThread:
        """The running loop thread, started on the first call."""
        with self._lock:
            if self._thread is None:
                thread = EventLoopThread(logger)
                thread.name = "conveyor-event-loop"
                thread.daemon = True
                thread.start(timeout=LOOP_START_TIMEOUT)
                self._thread = thread
            return self._thread

    def run(self, coro: Awaitable[T]) -> T:
        """Run ``coro`` on the loop and wait for its end in the calling thread (see the module's docstring)."""
        return self.loop_thread().run_coroutine(coro)

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread.loop.is_running():
            # EventLoopThread.stop() does this, untyped: the loop closes itself when run_forever returns.
            thread.loop.call_soon_threadsafe(thread.loop.stop)
            thread.join()


def run_async(app: App, coro: Awaitable[T]) -> T:
    """Run an async job's coroutine on ``app``'s event loop, waiting for it in the calling thread."""
    return app.resource(EventLoop, EventLoop).run(coro)


class Released:
    """What an async job's runner returns on a releasing worker thread: the coroutine, not yet started,
    and ``finish(value)``, which the finisher calls with the coroutine's value (it stores the result)."""

    def __init__(self, app: App, coro: Coroutine[Any, Any, Any], finish: Callable[[Any], None]) -> None:
        self.app = app
        self.coro = coro
        self.finish = finish

    def start(self, done: Callable[[AsyncRun], None]) -> AsyncRun:
        """Start the coroutine on the App's loop; ``done(run)`` is called once, on the loop, when it ends."""
        run = AsyncRun(app_loop(self.app), self.coro, done)
        run.start()
        return run

    def discard(self) -> None:
        """Never started (its thread was interrupted before): close the coroutine, no 'never awaited' warning."""
        self.coro.close()


def app_loop(app: App) -> asyncio.AbstractEventLoop:
    return app.resource(EventLoop, EventLoop).loop_thread().loop


class AsyncRun:
    """One async job's coroutine on the loop: its end, and the interrupts (time limit, cancel) that end it early.

    ``outcome`` is set once: the coroutine's value or exception, or the first
    interrupt's exception (raised instead of the value if the coroutine
    swallowed its cancellation, or set alone :data:`CANCEL_GRACE` seconds
    after the cancel if it has not ended).
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], done: Callable[[AsyncRun], None]
    ) -> None:
        self.loop = loop
        self.coro = coro
        self.done = done
        self.outcome: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.interrupt: type[BaseException] | None = None
        self._task: asyncio.Task[Any] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.loop.call_soon_threadsafe(self._begin)

    def interrupt_with(self, exception: type[BaseException]) -> None:
        """End the run with ``exception`` (a time limit, a cancel): from any thread, the first one wins."""
        self.loop.call_soon_threadsafe(self._interrupt, exception)

    def interrupt_at(self, deadline: float, exception: type[BaseException]) -> None:
        """``interrupt_with(exception)`` at ``deadline`` (``time.monotonic()``, the loop's clock)."""
        self.loop.call_soon_threadsafe(self._arm, deadline, exception)

    # -- on the loop ---------------------------------------------------------------

    def _begin(self) -> None:
        if self.interrupt is not None:  # interrupted before it began: never start it
            self.coro.close()
            self._settle(exception=self.interrupt())
            return
        self._task = self.loop.create_task(self._body())

    async def _body(self) -> None:
        try:
            value = await self.coro
        except asyncio.CancelledError:
            self._settle(exception=(self.interrupt or asyncio.CancelledError)())
            return
        except BaseException as exc:
            self._settle(exception=exc)
            return
        if self.interrupt is not None:  # it swallowed the cancel: the attempt still ends interrupted
            self._settle(exception=self.interrupt())
        else:
            self._settle(value=value)

    def _arm(self, deadline: float, exception: type[BaseException]) -> None:
        if self.outcome.done():
            return
        self._timer = self.loop.call_at(
            self.loop.time() + max(0.0, deadline - time.monotonic()), self._interrupt, exception
        )

    def _interrupt(self, exception: type[BaseException]) -> None:
        if self.outcome.done() or self.interrupt is not None:
            return
        self.interrupt = exception
        if self._task is not None:
            self._task.cancel()
            self.loop.call_later(CANCEL_GRACE, self._give_up)

    def _give_up(self) -> None:
        if not self.outcome.done() and self.interrupt is not None:
            logger.warning("an async job's coroutine did not end within %ss of its cancel: left running", CANCEL_GRACE)
            self._settle(exception=self.interrupt())

    def _settle(self, *, value: Any = None, exception: BaseException | None = None) -> None:
        if self.outcome.done():
            return
        if self._timer is not None:
            self._timer.cancel()
        if exception is not None:
            self.outcome.set_exception(exception)
        else:
            self.outcome.set_result(value)
        try:
            self.done(self)
        except Exception:  # the hand-off to the finisher is a queue put: this is a bug, say so
            logger.exception("an async job's end was not handed to its finisher")


_here = threading.local()


def mark_releasing() -> None:
    """Called by a releasing worker thread at its start: async jobs it runs are handed off, not waited for."""
    _here.releases = True


def releases_here() -> bool:
    """Whether the calling thread is a releasing worker thread (conveyor.tasks.releasing)."""
    return bool(getattr(_here, "releases", False))

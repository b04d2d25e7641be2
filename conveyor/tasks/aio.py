"""Async jobs: an ``async def`` processor runs on the App's event loop, one loop thread per process.

The loop is Dramatiq 2.x's :class:`~dramatiq.asyncio.EventLoopThread`,
started on the first async job and stopped by ``App.close()``. The
Dramatiq worker thread that took the message submits the coroutine and
waits for it (:meth:`EventLoopThread.run_coroutine`), so everything
Dramatiq does around a job holds unchanged: the queue's concurrency (the
worker's threads) bounds the coroutines in flight, the ack follows the
coroutine's end, and a time limit's ``TimeLimitExceeded``, raised in the
waiting thread, cancels the coroutine (``CancelledError`` at its
``await``) and fails the attempt.

What it costs: the waiting worker thread is parked on a future, it uses
no CPU, but it is held, so a queue of awaiting jobs needs as many threads
as coroutines it should run at once (raise the queue's concurrency: an
idle thread costs a stack, not a core). The coroutines themselves share
one thread: a job that blocks (a sync database call, ``time.sleep``)
blocks every async job of the process; use ``asyncio.to_thread`` for those.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from dramatiq.asyncio import EventLoopThread

if TYPE_CHECKING:
    from conveyor.app import App

T = TypeVar("T")

#: Seconds the loop gets to start; it starts in microseconds, so this only catches a broken interpreter.
LOOP_START_TIMEOUT = 5.0

logger = logging.getLogger("conveyor.aio")


def is_async(fn: Any) -> bool:
    """Whether ``fn`` is an ``async def`` processor (a coroutine function)."""
    return inspect.iscoroutinefunction(fn)


class EventLoop:
    """The App's event loop thread, started on first use; ``close()`` stops it (an App resource)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: EventLoopThread | None = None

    def run(self, coro: Awaitable[T]) -> T:
        """Run ``coro`` on the loop and wait for its end in the calling thread (see the module's docstring)."""
        with self._lock:
            if self._thread is None:
                thread = EventLoopThread(logger)
                thread.name = "conveyor-event-loop"
                thread.daemon = True
                thread.start(timeout=LOOP_START_TIMEOUT)
                self._thread = thread
            thread = self._thread
        return thread.run_coroutine(coro)

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread.loop.is_running():
            # EventLoopThread.stop() does this, untyped: the loop closes itself when run_forever returns.
            thread.loop.call_soon_threadsafe(thread.loop.stop)
            thread.join()


def run_async(app: App, coro: Awaitable[T]) -> T:
    """Run an async job's coroutine on ``app``'s event loop."""
    return app.resource(EventLoop, EventLoop).run(coro)

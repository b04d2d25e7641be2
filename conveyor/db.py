"""Postgres access shared by every store: pools, named queries, and the one psycopg error translation.

SQL lives in ``.sql`` files beside the module that runs it, as named
blocks (``-- name: consume``), loaded once at import.

psycopg's errors enter conveyor's error tree here and nowhere else
(:func:`translate`, :class:`wrap_errors`): :class:`~conveyor.errors.DatabaseUnavailable`
when Postgres cannot be reached (try again later),
:class:`~conveyor.errors.DatabaseRefused` when it refused a statement. The
pool :func:`open_pool` opens translates at the end of every
``with pool.connection()`` block (and a :func:`connect` connection at the end
of ``with conn:``), so every store on the App's pool is covered without a
``try`` of its own, and an ``except
psycopg.errors.UniqueViolation`` inside such a block still sees psycopg's error.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from conveyor.errors import DatabaseRefused, DatabaseUnavailable
from conveyor.interrupts import pooled
from conveyor.queries import load_queries as load_queries  # where the stores have always imported it

#: Errors that mean "Postgres is not reachable right now (or timed out, or chose this
#: transaction as a deadlock victim)": try again later. Every other psycopg error is a refusal.
UNAVAILABLE = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout, PoolClosed)

#: What a statement can raise: psycopg's errors, the pool's, and text psycopg cannot encode
#: (a lone surrogate) or decode (a byte a non-UTF-8 database holds).
STATEMENT_ERRORS = (psycopg.Error, PoolTimeout, PoolClosed, UnicodeError)


def translate(exc: BaseException, what: str) -> DatabaseUnavailable | DatabaseRefused:
    """The conveyor error for a psycopg (or pool) error, saying what was being done.

    Only the first line of the library's message: its DETAIL may quote a
    row's contents (payloads, which may hold secrets).
    """
    text = str(exc).strip()
    summary = f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"
    if isinstance(exc, UNAVAILABLE):
        return DatabaseUnavailable(f"Postgres is unavailable ({what}): {summary}")
    return DatabaseRefused(f"Postgres refused {what}: {summary}")


class ReplyDeadline:
    """``with ReplyDeadline(conn, seconds) as deadline:``: past ``seconds``, ``conn``'s socket is shut down.

    libpq waits for a reply without a bound, and neither TCP's user timeout
    nor keepalives notice a peer (a proxy, a pooler) that holds the line up
    but never answers, nor a COMMIT held by a synchronous standby that is
    gone. Shutting the socket down makes the wait end with an
    OperationalError; :attr:`expired` then says that was the deadline. An
    expired connection is closed on the way out (its pool drops it), even if
    its reply came just in time. The deadlines of a process share one
    watchdog thread (:class:`_Watchdog`): a timer thread per enqueue cost
    about 0.13 ms each.
    """

    def __init__(self, conn: psycopg.Connection[Any], seconds: float) -> None:
        self.conn, self.seconds = conn, seconds
        self.expired = False
        self.done = False
        self._lock = threading.Lock()

    def __enter__(self) -> ReplyDeadline:
        _WATCHDOG.watch(self, time.monotonic() + self.seconds)
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.done = True
        if self.expired:
            self.conn.close()

    def expire(self) -> None:
        """Shut the connection's socket down, unless the block has ended (called by the watchdog)."""
        with self._lock:
            if self.done:
                return
            self.expired = True
            with contextlib.suppress(OSError, psycopg.Error):
                # A dup of the descriptor: shutdown reaches the socket itself, the close only the dup.
                with socket.socket(fileno=os.dup(self.conn.fileno())) as sock:
                    sock.shutdown(socket.SHUT_RDWR)


class _Watchdog:
    """One daemon thread per process that expires the :class:`ReplyDeadline` s whose time has come.

    Started on first use in each process: a forked child (a worker process)
    gets a fresh heap, lock and thread of its own, since the parent's thread
    does not exist there and its lock may have been held at the fork.
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, ReplyDeadline]] = []
        self._order = itertools.count()
        self._started = False
        #: The heap's size at which ended deadlines are swept out (each holds its connection).
        self._sweep_at = _SWEEP_FLOOR

    def watch(self, deadline: ReplyDeadline, when: float) -> None:
        with self._cond:
            if not self._started:
                threading.Thread(target=self._run, name="conveyor-reply-deadlines", daemon=True).start()
                self._started = True
            heapq.heappush(self._heap, (when, next(self._order), deadline))
            if len(self._heap) >= self._sweep_at:
                # Ended deadlines leave the heap only from its top, after their whole timeout: with
                # many enqueues a second that is rate x timeout entries. Sweep them out (amortised).
                self._heap[:] = [entry for entry in self._heap if not entry[2].done]
                heapq.heapify(self._heap)
                self._sweep_at = max(_SWEEP_FLOOR, 2 * len(self._heap))
            if self._heap[0][2] is deadline:  # sooner than what the thread sleeps for
                self._cond.notify()

    def _run(self) -> None:
        cond = self._cond
        with cond:
            while True:
                now = time.monotonic()
                heap = self._heap
                while heap and (heap[0][2].done or heap[0][0] <= now):
                    _, _, deadline = heapq.heappop(heap)
                    if not deadline.done:
                        try:
                            deadline.expire()
                        except Exception:  # the thread must outlive any one deadline, or none is kept
                            logging.getLogger(__name__).exception("expiring a reply deadline failed")
                cond.wait(heap[0][0] - now if heap else None)


_SWEEP_FLOOR = 1024
_WATCHDOG = _Watchdog()


class wrap_errors(contextlib.ContextDecorator):
    """``with wrap_errors("reading a run"):`` (or ``@wrap_errors(...)``): psycopg errors leave it translated.

    ``raise translate(exc) from exc``, so the log's chain still has psycopg's
    own error; conveyor's errors and everything else pass untouched.
    """

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> wrap_errors:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None and isinstance(exc, STATEMENT_ERRORS):
            raise translate(exc, self.what) from exc


class ShieldedPool(ConnectionPool):
    """psycopg's pool whose checkout and return a job's time limit never interrupts (``conveyor.interrupts``):
    landing in either, it would leak the connection. What runs between them is interrupted as before."""

    @contextlib.contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
        with pooled(lambda: self.getconn(timeout), self.putconn) as conn:
            with conn:  # commit or roll back, as psycopg's pool does; a pool's connection is never closed here
                yield conn


class Pool(ShieldedPool):
    """The shielded pool, whose connections' errors are translated when they leave ``with pool.connection()``.

    The pool itself sees psycopg's error first (it discards a broken
    connection); the caller gets conveyor's.
    """

    @contextlib.contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
        with wrap_errors("a statement"), super().connection(timeout) as conn:
            yield conn


def through_pooler(pooled: bool) -> dict[str, Any]:
    """Connection options for a URL that goes through a transaction-mode pooler (PgBouncer), or none.

    psycopg prepares a statement on the server once it ran a few times; through
    a pooler in transaction mode the next transaction may land on another server
    connection, where the prepared statement does not exist (PgBouncer < 1.21).
    """
    return {"prepare_threshold": None} if pooled else {}


def open_pool(url: str, *, min_size: int = 1, max_size: int = 20, name: str = "conveyor", pooled: bool = False) -> Pool:
    """An autocommit pool (errors translated: :class:`Pool`); callers open ``conn.transaction()`` where they need one.

    No ping on checkout (it would add a round trip to every query): a
    connection broken by a server restart fails once, the job retries, and
    the pool discards it.
    """
    pool = Pool(
        url,
        min_size=min_size,
        max_size=max_size,
        name=name,
        open=False,
        kwargs={"autocommit": True, **through_pooler(pooled)},
        reconnect_timeout=60,
    )
    try:
        pool.open(wait=True, timeout=30)
    except psycopg.Error as exc:
        raise DatabaseUnavailable(f"cannot connect to Postgres: {exc}") from exc
    except Exception as exc:  # psycopg_pool.PoolTimeout
        pool.close()
        raise DatabaseUnavailable(f"cannot connect to Postgres: {exc}") from exc
    return pool


class Connection(psycopg.Connection[Any]):
    """A connection of its own whose errors are translated when they leave ``with conn:``, as the pool's do."""

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            super().__exit__(kind, exc, tb)  # commits or rolls back a non-autocommit block: that may fail too
        except STATEMENT_ERRORS as failed:
            raise translate(failed, "the end of a transaction") from failed
        if exc is not None and isinstance(exc, STATEMENT_ERRORS):
            raise translate(exc, "a statement") from exc


@wrap_errors("connecting")
def connect(url: str, **kwargs: Any) -> Connection:
    """One connection (the migrator's, the CLI's), with connection errors translated and those of
    ``with connect(url) as conn:`` blocks too."""
    return Connection.connect(url, **kwargs)

"""The Postgres broker's background thread: wake-ups from ``LISTEN`` and this worker's heartbeat.

One thread and one connection per worker process. It listens on the
channel the enqueue's ``NOTIFY`` (sent in the enqueue's own transaction)
goes to, and wakes the consumers of the queue named in each notification.
On the same connection it writes the worker's heartbeat every sixth of the
lease (``PG_HEARTBEATS_PER_LEASE``). When the connection breaks it reconnects with a growing delay, and
once back it wakes every consumer: notifications sent meanwhile were lost,
so they claim at once instead of waiting for their poll.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

import psycopg

from conveyor.logs import log_error, log_event

#: Longest wait between two reconnection attempts (s).
RECONNECT_MAX_DELAY = 2.0

#: Longest the thread blocks in one wait, so that stop() is quick (s).
WAIT_SLICE = 0.25


class Wake:
    """How one consumer is woken: by a notification for its queue, or poked (an outcome to write)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        #: True when a notification came since the consumer last armed: there may be new jobs.
        self.notified = False

    def notify(self) -> None:
        self.notified = True
        self.event.set()

    def poke(self) -> None:
        self.event.set()

    def arm(self) -> None:
        """Called right before a claim: a notification from now on is kept for the next wait."""
        self.notified = False


class Listener(threading.Thread):
    """LISTEN for enqueues and heartbeat, on one connection of its own.

    ``connect()`` returns a new autocommit connection; ``on_connect(conn)``
    runs the LISTEN; ``heartbeat(conn)`` writes this worker's heartbeat
    (``Jobs.connect_listener``, ``Jobs.listen``, ``Jobs.heartbeat``); ``notifications(conn, timeout)``
    waits for the queues named by notifications (``Jobs.notifications``).
    """

    def __init__(
        self,
        *,
        connect: Callable[[], psycopg.Connection],
        on_connect: Callable[[psycopg.Connection], None],
        heartbeat: Callable[[psycopg.Connection], None],
        heartbeat_interval: float,
        notifications: Callable[[psycopg.Connection, float], Iterable[str]],
    ) -> None:
        super().__init__(name="conveyor-pg-listen", daemon=True)
        self._connect = connect
        self._on_connect = on_connect
        self._heartbeat = heartbeat
        self._notifications = notifications
        self.heartbeat_interval = heartbeat_interval
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._wakes: dict[str, set[Wake]] = defaultdict(set)
        #: Set once the first heartbeat is written: this worker may claim.
        self.ready = threading.Event()
        #: monotonic time the last heartbeat that was written was sent.
        self.last_beat = -math.inf
        #: monotonic time since which the connection has been up; None while it is down.
        #: Starts in the distant past: a fresh worker may run recovery at once.
        self.up_since: float | None = -math.inf
        self.last_error: str | None = None

    # -- consumers -------------------------------------------------------------

    def subscribe(self, queue: str) -> Wake:
        wake = Wake()
        with self._lock:
            self._wakes[queue].add(wake)
        return wake

    def unsubscribe(self, queue: str, wake: Wake) -> None:
        with self._lock:
            self._wakes[queue].discard(wake)

    def _wake(self, queue: str | None) -> None:
        with self._lock:
            wakes = [w for q, ws in self._wakes.items() if queue is None or q == queue for w in ws]
        for wake in wakes:
            wake.notify()

    # -- thread ----------------------------------------------------------------

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(timeout)

    def beating(self, within: float) -> bool:
        """True when a heartbeat was written in the last ``within`` seconds."""
        return time.monotonic() - self.last_beat < within

    def run(self) -> None:
        delay = 0.1
        while not self._stopping.is_set():
            conn = None
            try:
                conn = self._connect()
                self._on_connect(conn)
                self._beat(conn)
                if self.up_since is None:
                    self.up_since = time.monotonic()
                    log_event(
                        "reconnected", queue=None, job=None, job_id=None, attempt=None, component="postgres listener"
                    )
                # Whatever was enqueued while we were not listening: claim it now.
                self._wake(None)
                delay = 0.1
                self._listen(conn)
            except Exception as exc:  # DatabaseUnavailable mostly; nothing may end the heartbeat for good
                if self.up_since is not None:
                    log_error(f"postgres listener lost its connection: {type(exc).__name__}: {exc}")
                self.up_since = None
                self.last_error = f"{type(exc).__name__}: {exc}"
            finally:
                if conn is not None:
                    conn.close()
            self._stopping.wait(delay)
            delay = min(delay * 2, RECONNECT_MAX_DELAY)

    def _listen(self, conn: psycopg.Connection) -> None:
        while not self._stopping.is_set():
            until_beat = self.last_beat + self.heartbeat_interval - time.monotonic()
            if until_beat <= 0:
                self._beat(conn)
                continue
            for queue in self._notifications(conn, min(WAIT_SLICE, until_beat)):
                self._wake(queue)

    def _beat(self, conn: psycopg.Connection) -> None:
        sent = time.monotonic()  # the server stamps the heartbeat after this: an age from here errs on the old side
        self._heartbeat(conn)
        self.last_beat = sent
        self.ready.set()

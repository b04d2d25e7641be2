"""Proof that a claim is on disk before its job starts: one synchronous commit per claim batch, off the claim path.

The delivery number a claim counts is the fence of everything that run
writes later, so it must never be handed out twice, not even after a
Postgres crash. A claim committed synchronously is on disk when it
returns, but then every claim waits for a WAL flush on the consumer's
thread, and the consumer is one thread: measured, that cost a quarter of
the throughput. So claims commit asynchronously, and this module proves
them durable *in parallel*, before any of their jobs starts:

- before sending a claim, the consumer notes the prover's connection
  (its *epoch*); after the claim returns it asks for a proof (a ticket);
- the prover thread, on a connection of its own, commits a transaction
  that writes WAL (a transactional logical message, prefix
  ``conveyor.claims``, which touches no table) synchronously. WAL is
  flushed in order, so that flush also flushes every claim that returned
  before it began;
- a crash ends every backend, the prover's too: a proof counts only on the
  connection that was open before the claim was sent. A ticket from an
  epoch that ended without its proof is *lost*: its job never starts and
  nothing is written for that delivery (the orphan pass or recovery hands
  the row out again, under a new number).

A worker thread's start waits for its claim's proof (usually long done: a
batch waits in the prefetch while the proof is written). One flush per
claim batch, and none on the consumer's path.
"""

from __future__ import annotations

import itertools
import threading
import time

import psycopg

from conveyor.brokers.postgres.jobs import Jobs
from conveyor.logs import log_error

#: Longest wait between two reconnections of the prover (s).
RECONNECT_MAX_DELAY = 2.0

#: A ticket: (epoch, number). Epoch 0 is "claimed synchronously, proven already".
Ticket = tuple[int, int]
PROVEN: Ticket = (0, 0)

_epochs = itertools.count(1)


class ClaimProofs(threading.Thread):
    """The prover thread of one worker process. ``ticket()`` / ``request()`` / ``wait()`` are thread-safe."""

    def __init__(self, jobs: Jobs) -> None:
        super().__init__(name="conveyor-pg-prover", daemon=True)
        self.jobs = jobs
        self._cond = threading.Condition()
        self._stopping = False
        self.epoch = 0  # the prover's connection; 0 while it has none
        self._requested = 0
        self._proven = 0

    # -- consumer and worker threads -------------------------------------------------

    def epoch_before_claim(self) -> int:
        """Call before sending a claim; 0 means no prover connection: claim synchronously."""
        with self._cond:
            return self.epoch

    def request(self, epoch: int) -> Ticket:
        """After an asynchronous claim sent while ``epoch`` was current returned: a ticket to wait on."""
        with self._cond:
            self._requested += 1
            self._cond.notify_all()
            return (epoch, self._requested)

    def wait(self, ticket: Ticket, timeout: float) -> bool | None:
        """True once the claim is proven durable; False if it never can be (lost); None on timeout."""
        if ticket[0] == 0:
            return True
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self.epoch != ticket[0]:
                    return False
                if self._proven >= ticket[1]:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self.is_alive():
            self.join(5)

    # -- the thread ----------------------------------------------------------------------

    def run(self) -> None:
        delay = 0.1
        while not self._stopping:
            conn = None
            try:
                conn = self.jobs.connect()
                self.jobs.prover_session(conn)
                with self._cond:
                    self.epoch = next(_epochs)
                    self._proven = self._requested  # tickets of the old epoch are lost anyway
                    self._cond.notify_all()
                delay = 0.1
                self._prove(conn)
            except Exception as exc:  # DatabaseUnavailable mostly; nothing may end the prover for good
                log_error(f"postgres claim prover lost its connection: {type(exc).__name__}: {exc}")
            finally:
                with self._cond:
                    self.epoch = 0  # what was not proven on that connection never will be
                    self._cond.notify_all()
                if conn is not None:
                    conn.close()
            with self._cond:
                if not self._stopping:
                    self._cond.wait(delay)
            delay = min(delay * 2, RECONNECT_MAX_DELAY)

    def _prove(self, conn: psycopg.Connection) -> None:
        while True:
            with self._cond:
                while self._proven >= self._requested and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                target = self._requested
            self.jobs.prove(conn)
            with self._cond:
                self._proven = max(self._proven, target)
                self._cond.notify_all()

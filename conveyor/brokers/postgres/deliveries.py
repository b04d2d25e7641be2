"""This worker process's deliveries that have no written outcome yet: held ones, and the outbox.

A delivery is one claim of a job, named by ``(job id, delivery number)``.
From its claim until its outcome is in Postgres, the delivery is *owned*
here: :meth:`Deliveries.owned` lists it, and the orphan pass (recovery)
never hands an owned row back. That includes the moment the outcome is
being written: outcomes leave the outbox only once the statement that
wrote them returned.

Worker threads put outcomes here (no round trip on their path); the
consumer thread writes them all in one statement. When Postgres is
unreachable they stay and are written on the next try. When Postgres
*refuses* one (a value it cannot store, say), it is written alone, with
its error text replaced if that was the trouble, and dropped only if even
that fails: it then no longer blocks the others, and its row, still
claimed by this worker but no longer owned, goes back to the queue
through the orphan pass after a lease.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from conveyor.brokers.postgres.jobs import Jobs
from conveyor.errors import DatabaseRefused
from conveyor.logs import log_event

Key = tuple[str, int]


@dataclasses.dataclass
class Retry:
    """A retry written while Postgres was away: the message to store, when it may run, its error."""

    message: str
    due: float  # time.monotonic() at which it may run (a host clock stepped back must not delay it)
    error: str | None


class Deliveries:
    """Held deliveries and unwritten outcomes of one worker process. Thread-safe."""

    def __init__(self, jobs: Jobs) -> None:
        self.jobs = jobs
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # one writer at a time keeps retries before acks
        self._held: dict[str, int] = {}  # job id -> delivery, claimed here and without an outcome yet
        self._outcomes: dict[Key, tuple[str, str | None]] = {}
        self._retries: dict[Key, Retry] = {}
        self._writing: set[str] = set()  # ids whose outcome a write has in flight
        self._abandoned: set[Key] = set()  # deliveries whose next outcome must not be written
        self._retry_acked: set[Key] = set()  # deferred retries whose (void) ack already came
        self._writing_retries: set[Key] = set()

    # -- worker and consumer threads ---------------------------------------------

    def hold(self, job_id: str, delivery: int) -> None:
        with self._lock:
            self._held[job_id] = delivery

    def settle(self, job_id: str, delivery: int, status: str, error: str | None = None) -> None:
        """The delivery's outcome: done, failed (with the error), or pending (hand it back unstarted)."""
        key = (job_id, delivery)
        with self._lock:
            if key in self._abandoned:
                self._abandoned.discard(key)
            elif key in self._retries or key in self._writing_retries:
                self._retry_acked.add(key)  # the retry supersedes it
            else:
                previous = self._outcomes.get(key)
                # Handed back unstarted: the ack Dramatiq sends for the skipped run changes nothing.
                if not (previous and previous[0] == "pending"):
                    self._outcomes[key] = (status, error)
            if self._held.get(job_id) == delivery:
                del self._held[job_id]

    def forget(self, job_id: str, delivery: int) -> None:
        """The abandoned delivery's own last outcome came (and was not written): nothing more to skip."""
        with self._lock:
            self._abandoned.discard((job_id, delivery))
            if self._held.get(job_id) == delivery:
                del self._held[job_id]

    def drop(self, job_id: str, delivery: int) -> None:
        """No longer held, nothing to write (its outcome was written another way)."""
        with self._lock:
            if self._held.get(job_id) == delivery:
                del self._held[job_id]

    def abandon(self, job_id: str, delivery: int) -> None:
        """Write no outcome for this delivery: the row stays claimed in Postgres, but no longer owned
        here, so the orphan pass hands the job out again after the lease (its final failure could
        not be claimed, say: acking it would end the job without its hooks)."""
        with self._lock:
            self._abandoned.add((job_id, delivery))
            self._outcomes.pop((job_id, delivery), None)
            self._retries.pop((job_id, delivery), None)
            if self._held.get(job_id) == delivery:
                del self._held[job_id]

    def put_retry(self, job_id: str, delivery: int, retry: Retry) -> None:
        """A retry to write later; it supersedes the ack Dramatiq sends for the same delivery."""
        with self._lock:
            self._retries[(job_id, delivery)] = retry
            self._outcomes.pop((job_id, delivery), None)

    def owned(self) -> set[str]:
        """Ids this process holds or has an unwritten outcome for (the orphan pass leaves them alone)."""
        with self._lock:
            return set(self._held) | {k[0] for k in self._outcomes} | {k[0] for k in self._retries} | self._writing

    def unwritten(self) -> int:
        with self._lock:
            return len(self._outcomes) + len(self._retries)

    def __bool__(self) -> bool:
        return bool(self._outcomes or self._retries)

    # -- writing (consumer thread, broker close) -------------------------------------

    def write(self) -> None:
        """Write everything waiting. Raises DatabaseUnavailable, keeping what was not written."""
        if not self:
            return
        with self._write_lock:
            with self._lock:
                retries, self._retries = self._retries, {}
                outcomes, self._outcomes = self._outcomes, {}
                self._writing = {k[0] for k in retries} | {k[0] for k in outcomes}
                self._writing_retries = set(retries)
            try:
                while retries:
                    key, retry = next(iter(retries.items()))
                    try:
                        self.jobs.retry(
                            key[0], key[1], retry.message, max(0.0, retry.due - time.monotonic()), retry.error
                        )
                    except DatabaseRefused as exc:
                        # Not storable even after sanitising: run it again now rather than never.
                        _log_refused(key, "its retry", exc)
                        outcomes[key] = ("pending", None)
                    with self._lock:
                        # The ack that may still come must not be written (it could turn a retry a
                        # crash undid into done); as in PostgresBroker._retry. If it came already, done.
                        if key in self._retry_acked:
                            self._retry_acked.discard(key)
                        else:
                            self._abandoned.add(key)
                        self._writing_retries.discard(key)
                    del retries[key]
                if outcomes:
                    self._finish(outcomes)
            except BaseException:
                with self._lock:  # back before _writing is cleared: never in neither set
                    for key, retry in retries.items():
                        self._retries.setdefault(key, retry)
                        self._outcomes.pop(key, None)
                    for key, outcome in outcomes.items():
                        if key not in self._retries:
                            self._outcomes.setdefault(key, outcome)
                raise
            finally:
                with self._lock:
                    self._writing = set()
                    self._writing_retries = set()

    def _finish(self, outcomes: dict[Key, tuple[str, str | None]]) -> None:
        """Write ``outcomes``, removing each from the dict once written (or given up)."""
        try:
            self.jobs.finish(outcomes)
            outcomes.clear()
            return
        except DatabaseRefused:
            pass  # one of them is poisoned: each alone, so that it cannot block the others
        for key in list(outcomes):
            status, error = outcomes[key]
            try:
                self.jobs.finish({key: (status, error)})
            except DatabaseRefused as exc:
                try:
                    if error is None:
                        raise
                    self.jobs.finish({key: (status, f"(the error text could not be stored: {_cause(exc)})")})
                except DatabaseRefused:
                    _log_refused(key, f"its outcome ({status})", exc)
            del outcomes[key]


def _cause(exc: BaseException) -> str:
    """The library error's name only: its message may quote the very text that was refused."""
    return type(exc.__cause__ or exc).__name__


def _log_refused(key: Key, what: str, exc: Exception) -> None:
    log_event(
        "error",
        level="error",
        queue=None,
        job=None,
        job_id=key[0],
        attempt=None,
        error=f"delivery {key[1]}: {what} was not written, the job goes back to its queue after the lease: {exc}",
    )

"""What a processor gets besides its payload: the job's identity, the process's resources, and the fence.

The broker fences its own writes (start, outcome, retry) with the
delivery's number; a job's own effects are the job's to fence, and these
are the tools (issue 18, "exactly-once effects for users' own code"):

- ``ctx.delivery``: the delivery's fence number; it grows with every
  delivery of the job, so two deliveries never share one.
- ``ctx.once(conn, step)``: on every broker, records ``(job, step)``
  insert-first in the caller's open Postgres transaction; True for the
  first delivery whose transaction gets there, False for every other one.
  The step's effect, written in the same transaction only when it is True,
  then applies once per job, whichever delivery gets there first.
- ``with ctx.transaction() as conn:`` (or ``ctx.complete_in(conn)``): on
  the postgres broker, the job is completed inside the caller's
  transaction, together with its effects, and only while this delivery is
  current: a paused, cut-off or skewed worker's transaction rolls back
  with :class:`~conveyor.errors.DeliveryFenced`.
- ``ctx.check_fence()``: raises DeliveryFenced once the delivery is no
  longer current, for effects outside Postgres (a file, a request, a
  stream). One read on the broker's server; a positive answer is reused
  for :data:`FENCE_CACHE_SECONDS`. It narrows the window, it cannot close
  it: a pause right after the check still lets the effect through.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from conveyor.brokers.base import completes_in_transaction
from conveyor.budgets.base import Budget
from conveyor.errors import (
    DeliveryFenced,
    NoDelivery,
    TransactionalCompletionUnsupported,
    WaitForEvent,
    WaitTimeout,
)
from conveyor.events import WAITED_FOR, check_name, decode_resolution
from conveyor.tasks import steps

if TYPE_CHECKING:
    from psycopg import Connection

    from conveyor.app import App
    from conveyor.brokers.base import AnyMessage, TransactionalCompletion

#: Seconds a "still current" answer of ``check_fence`` is reused (monotonic clock): a loop that checks
#: on every item costs one read per 5 ms at most. The window in which a stale delivery passes the check
#: is this plus the read's round trip (and any pause after it, which no check can see).
FENCE_CACHE_SECONDS = 0.005


@dataclass
class _FenceState:
    """The last answer of ``check_fence`` (a stale delivery never becomes current again: kept for good)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    current_until: float = float("-inf")
    stale: bool = False


@dataclass(frozen=True)
class JobContext:
    """The running job's identity, the process's resources (database pool, JobQueue), and its fence."""

    job: str
    queue: str
    job_id: str
    attempt: int
    max_attempts: int
    app: "App"
    #: The delivery's fence number; None outside a delivery (a final-failure hook).
    delivery: int | None = None
    #: The delivered message (the broker's handle on this delivery); None outside a delivery.
    message: AnyMessage | None = field(default=None, repr=False, compare=False)
    #: The job's payload (its model); None outside a delivery.
    payload: Any = field(default=None, repr=False, compare=False)
    _fence: _FenceState = field(default_factory=_FenceState, repr=False, compare=False)

    @property
    def last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    @property
    def cancelled(self) -> bool:
        """True once this job's cancellation was asked (``app.jobs.cancel``): stop soon, the job ends
        ``cancelled``; after ``CONVEYOR_CANCEL_GRACE_SECONDS`` the run is interrupted (``JobCancelled``)."""
        return self.app.cancels.is_cancelled(self.job_id)

    # -- budgets ---------------------------------------------------------------------

    @property
    def budgets(self) -> tuple[Budget, ...]:
        """The budgets this job takes from: its queue's and its own (``conveyor.budgets``)."""
        job_type = self.app.job_types.get(self.job)
        return job_type.all_budgets(self.app.queues.get(self.queue)) if job_type else ()

    def spend(self, budget: str, amount: float) -> None:
        """Record ``amount`` of ``budget`` as used now (the tokens a call used, known after it).

        The weight counts in the budget's window from now on, under this job's key, so the
        jobs that follow wait for it; it is added to whatever the job's admission took.
        """
        from conveyor.budgets import spend

        spend(self, self.payload, self.budgets, budget, amount)

    # -- waiting for an event (conveyor.events) ------------------------------------

    def wait_for(self, name: str, timeout: float, *, raise_on_timeout: bool = False) -> Any:
        """The data of the signal ``name`` (``app.events.signal``), waiting up to ``timeout`` seconds for it.

        The first time, this ends the attempt (no attempt spent, no thread held):
        the job is parked, ``awaiting``, until the signal or the timeout, then runs
        again from the top, and this call returns at once with the signal's data,
        or None after the timeout (:class:`~conveyor.errors.WaitTimeout` with
        ``raise_on_timeout=True``). The answer is stored with the job: every later
        run of it gets the same one. Do not catch the exception it raises
        (:class:`~conveyor.errors.WaitForEvent`); put effects before the wait in
        ``ctx.once``, since they run again on resumption. A signal sent before
        the wait is kept (``CONVEYOR_EVENT_TTL_SECONDS``) and returned at once.
        """
        check_name(name)
        if not timeout > 0:
            raise ValueError("wait_for: timeout must be a positive number of seconds")
        if self.message is None:
            raise NoDelivery(f"job {self.job_id}: a final-failure hook cannot wait for an event")
        timed_out = self.message.options.get(WAITED_FOR) == name
        stored = self.app.broker.resolve_wait(self.job_id, name, timed_out=timed_out)
        if stored is None:
            raise WaitForEvent(name, timeout=timeout)
        expired, data = decode_resolution(stored)
        if expired and raise_on_timeout:
            raise WaitTimeout(f"job {self.job_id}: no signal of the awaited event within its timeout")
        return data

    # -- exactly-once effects ------------------------------------------------------

    def once(self, conn: Connection[Any], step: str) -> bool:
        """True when this call records ``step`` of this job first; write the step's effect only then.

        ``conn`` must be inside a transaction (``with conn.transaction():``),
        the one the effect is written in: the record and the effect commit
        together, or neither does. Works on every broker (the record is in
        ``conn``'s database, table ``conveyor_job_steps``). A delivery that
        reaches the step while another holds it uncommitted waits for it.
        Final-failure hooks may use it too (keyed by the job id).
        """
        return steps.record(conn, self.job_id, step, self.delivery)

    @property
    def can_complete_in_transaction(self) -> bool:
        """True when :meth:`transaction` and :meth:`complete_in` work here (the postgres broker, in a delivery)."""
        return self.message is not None and self.app.capabilities.transactional_completion

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection[Any]]:
        """``with ctx.transaction() as conn:`` your effects, and the job completes in the same commit.

        A connection from the App's pool, in a transaction; at the end of
        the block the job's completion is written in it, only while this
        delivery is current, and the whole commits. When the delivery is no
        longer current, :class:`~conveyor.errors.DeliveryFenced` is raised
        and everything written in the block rolls back. After the commit the
        ordinary ack writes nothing. The postgres broker only (the App's pool
        and the broker share ``DATABASE_URL``); elsewhere it raises
        :class:`~conveyor.errors.TransactionalCompletionUnsupported`.
        """
        broker, message = self._completing_broker()
        with self.app.pool.connection() as conn:
            with conn.transaction():
                yield conn
                broker.complete_in(conn, message)
            broker.completed_in_transaction(message)

    def complete_in(self, conn: Connection[Any]) -> None:
        """Complete the job inside ``conn``'s open transaction, only while this delivery is current.

        For a transaction of your own: ``conn`` must be on the broker's
        database (the same ``DATABASE_URL``), and this is best called last,
        just before the commit (the job's row stays locked until then).
        Raises :class:`~conveyor.errors.DeliveryFenced` when the delivery is
        no longer current: let it roll the transaction back. If the
        transaction commits, the job is done and the ordinary ack that
        follows changes nothing; if it rolls back, nothing happened.
        """
        broker, message = self._completing_broker()
        broker.complete_in(conn, message)

    def check_fence(self) -> None:
        """Raise :class:`~conveyor.errors.DeliveryFenced` when this delivery is no longer the job's current one.

        For effects outside Postgres: call it before each (in a loop, too).
        One read on the broker's server (Redis: one HMGET; Postgres: one
        primary-key SELECT); a "current" answer is reused for
        :data:`FENCE_CACHE_SECONDS`. A stale answer is final.
        """
        state = self._fence
        if self.message is None:
            raise NoDelivery(f"job {self.job_id}: a final-failure hook has no delivery to fence")
        with state.lock:
            if not state.stale and time.monotonic() < state.current_until:
                return
            if not state.stale:
                asked = time.monotonic()
                if self.app.broker.is_current(self.message):
                    state.current_until = asked + FENCE_CACHE_SECONDS
                    return
                state.stale = True
        raise DeliveryFenced(
            f"delivery {self.delivery} of job {self.job_id} is no longer current: the job was taken back "
            "or handed to another delivery"
        )

    def _completing_broker(self) -> tuple[TransactionalCompletion, AnyMessage]:
        broker = self.app.broker
        if self.message is None:
            raise NoDelivery(f"job {self.job_id}: a final-failure hook has no delivery to complete")
        if not completes_in_transaction(broker):
            raise TransactionalCompletionUnsupported(
                f"the {self.app.settings.broker_name} broker keeps jobs outside Postgres: a job completes in a "
                "transaction on the postgres broker only (ctx.once works on every broker)"
            )
        return broker, self.message

"""Dramatiq's adapter for the Postgres broker: :class:`PostgresBroker`.

It turns Dramatiq's calls (enqueue, consume, the retries middleware's
start and final-failure claim) into calls of :class:`~.jobs.Jobs`, the
data access, and keeps this process's deliveries in
:class:`~.deliveries.Deliveries`. The rules it enforces:

- a delivery whose start could not be written never runs (it is handed
  back unstarted, ``SkipMessage``): no hook of Dramatiq's may swallow it;
- a retry that could not be written is kept and supersedes the ack that
  follows; one Postgres refuses hands the job back instead; a final-failure
  claim that could not be written leaves the job held, never acked, and the
  orphan pass hands it out again;
- every write of a delivery names its delivery number (the fence).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import psycopg
from dramatiq import Broker, Message, Middleware
from dramatiq.common import q_name
from dramatiq.errors import ConnectionClosed, QueueJoinTimeout, QueueNotFound
from dramatiq.middleware import SkipMessage

from conveyor.brokers.base import (
    CANCELLED,
    CANCELLED_AT_START,
    MAX_GROUPS,
    AnyMessage,
    CancelListener,
    CancelOutcome,
    Capabilities,
    ConveyorBroker,
    EnqueueItem,
    FinalFailure,
    JobRecord,
    JobRef,
    PoolOwner,
    QueueCounts,
    QueueGroups,
    announce_unknown_job,
    as_message,
    check_state,
    encode_message,
    log_delivery_error,
    malformed_error,
    priority_of,
    unknown_job_error,
)
from conveyor.brokers.postgres.consumer import DELIVERY_OPTIONS, PostgresConsumer
from conveyor.brokers.postgres.deliveries import Deliveries, Retry
from conveyor.brokers.postgres.durability import PROVEN, ClaimProofs
from conveyor.brokers.postgres.jobs import POOL_TIMEOUT, Jobs, NewJob, unstorable_path
from conveyor.brokers.postgres.listen import Listener
from conveyor.brokers.postgres.recovery import Recovery
from conveyor.errors import ConveyorError, DatabaseRefused, DatabaseUnavailable, DeliveryFenced, InvalidPayload
from conveyor.events import PARK
from conveyor.logs import log_error, log_event
from conveyor.settings import PG_HEARTBEATS_PER_LEASE

if TYPE_CHECKING:
    from collections.abc import Callable

    from conveyor.brokers.fleet.base import FleetStore
    from conveyor.brokers.rollup.base import RollupStore
    from conveyor.settings import Settings

#: Seconds a job's start waits for Postgres to come back before the job is handed back unstarted.
START_GRACE = 5.0

#: Message option: the final failure of this delivery could not be claimed; write no outcome.
ABANDON = "pg_abandon"

#: Message option: this delivery completed its job in the caller's transaction (committed); write no outcome.
COMPLETED = "pg_completed"


class PostgresBroker(ConveyorBroker, Broker):
    """Dramatiq broker plus conveyor's job interface, on one Postgres table.

    ``on_dead(broker, message, error)`` runs a job's final failure found at
    claim (undecodable message). The App passes its own
    ``App.final_failure`` (the callback its Retries middleware runs too); with
    None such a job is only logged. Passed in, not looked up in the
    middleware, so the broker never imports a middleware.
    """

    #: Jobs are rows of the database the caller's transactions run on.
    capabilities = Capabilities(
        store="postgres", queue_in_postgres=True, transactional_enqueue=True, transactional_completion=True
    )

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        middleware: list[Middleware],
        on_dead: FinalFailure | None,
        database_url: Callable[[], str],
    ) -> PostgresBroker:
        return cls(database_url(), middleware=middleware, settings=settings, on_dead=on_dead)

    def fleet_store(self, pools: PoolOwner) -> FleetStore:
        from conveyor.brokers.fleet.postgres_store import PostgresFleetStore

        return PostgresFleetStore(pools, retention=self.recovery.retention)

    @classmethod
    def fleet_store_without_broker(cls, settings: Settings, pools: PoolOwner) -> FleetStore | None:
        from conveyor.brokers.fleet.postgres_store import PostgresFleetStore

        return PostgresFleetStore(pools, retention=settings.retention)

    def rollup_store(self, pools: PoolOwner) -> RollupStore:
        from conveyor.brokers.rollup.postgres_store import PostgresRollupStore

        return PostgresRollupStore(pools)

    def __init__(
        self,
        database_url: str,
        *,
        middleware: list[Middleware] | None = None,
        settings: Settings,
        on_dead: FinalFailure | None = None,
    ) -> None:
        super().__init__(middleware=middleware)
        self.database_url = database_url
        self.queues: set[str] = set()
        self.poll_seconds = settings.pg_poll_seconds
        self.lease = settings.pg_lease_seconds
        self.unknown_job_delay = settings.unknown_job_delay
        self.priority_aging = settings.priority_aging_seconds
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.jobs = Jobs(
            database_url,
            self.worker_id,
            pooled=settings.database_pooled,
            listen_url=settings.listen_database_url,
            enqueue_timeout=settings.pg_enqueue_timeout,
        )
        self.deliveries = Deliveries(self.jobs)
        self.recovery = Recovery(
            self.jobs,
            self.deliveries,
            lease=self.lease,
            interval=settings.pg_recovery_seconds,
            retention=settings.retention,
        )
        self._on_dead = on_dead
        self._lock = threading.RLock()
        self.listener = self._new_listener()
        self.proofs = ClaimProofs(self.jobs)
        self._consumed: set[str] = set()

    def _new_listener(self) -> Listener:
        return Listener(
            connect=self.jobs.connect_listener,
            on_connect=self.jobs.listen,
            heartbeat=self._heartbeat,
            heartbeat_interval=self.lease / PG_HEARTBEATS_PER_LEASE,
            notifications=self.jobs.notifications,
        )

    def _heartbeat(self, conn: psycopg.Connection) -> None:
        self.jobs.heartbeat(conn, socket.gethostname(), os.getpid(), sorted(self._consumed))

    # -- Dramatiq's Broker -------------------------------------------------------

    def declare_queue(self, queue_name: str) -> None:
        # No delay queues: a delayed job is a row whose available time is later.
        if queue_name not in self.queues:
            self.emit_before("declare_queue", queue_name)
            self.queues.add(queue_name)
            self.emit_after("declare_queue", queue_name)

    def get_declared_queues(self) -> set[str]:
        return set(self.queues)

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 30000) -> PostgresConsumer:
        if q_name(queue_name) not in self.queues:
            raise QueueNotFound(queue_name)
        with self._lock:
            self._consumed.add(q_name(queue_name))
            if not self.listener.is_alive():
                self.listener.start()
            if not self.proofs.is_alive():
                self.proofs.start()
        # Claim nothing before this worker's heartbeat row exists: recovery
        # would take the claims of a worker it cannot see.
        if not self.listener.ready.wait(POOL_TIMEOUT):
            raise ConnectionClosed(f"Postgres is unavailable: {self.listener.last_error}")
        return PostgresConsumer(self, queue_name, prefetch, timeout)

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        """Dramatiq's enqueue: a new job, or (for a message of a current delivery) its retry.

        ``message`` may be the proxy a middleware was handed (Dramatiq's stock Retries passes it).
        """
        message = as_message(message)
        if "pg_delivery" in message.options:
            return self._retry(message, delay)
        self.enqueue_jobs([EnqueueItem(message, None, delay)], dedup_ttl=1)
        return message

    def close(self) -> None:
        """Stop listening and heartbeating, write pending outcomes, leave. The broker can be used again."""
        with self._lock:
            listener, self.listener = self.listener, self._new_listener()
            proofs, self.proofs = self.proofs, ClaimProofs(self.jobs)
            self._consumed.clear()
        listener.stop()
        proofs.stop()
        try:
            self.deliveries.write()
        except ConveyorError as exc:
            log_error(
                f"outcomes of {self.deliveries.unwritten()} job(s) not written, recovery "
                f"will hand them out again: {exc}"
            )
        if listener.ready.is_set() and not self.deliveries.owned():
            # Gone for good: its leftover rows are recovered at the next pass, not after the lease.
            # Not while it still owns deliveries (a job running past the shutdown timeout): those
            # would be rerun at once while they run; they age out through the lease instead.
            with contextlib.suppress(ConveyorError):
                self.jobs.forget_worker()
        self.jobs.close()

    def flush(self, queue_name: str) -> None:
        self.jobs.flush(q_name(queue_name))

    def flush_all(self) -> None:
        for queue in self.queues:
            self.flush(queue)

    def join(self, queue_name: str, *, interval: int = 100, timeout: int | None = None) -> None:
        """Wait until ``queue_name`` has no pending or running job (tests)."""
        deadline = timeout and time.monotonic() + timeout / 1000
        while self.jobs.unfinished(q_name(queue_name)):
            if deadline and time.monotonic() >= deadline:
                raise QueueJoinTimeout(queue_name)
            time.sleep(interval / 1000)

    # -- enqueue -----------------------------------------------------------------

    def enqueue_jobs(
        self, items: list[EnqueueItem], *, dedup_ttl: float, connection: psycopg.Connection[Any] | None = None
    ) -> list[JobRef]:
        """Insert jobs; with ``connection``, inside the caller's transaction (a savepoint if one is open)."""
        rows = [self._row(item) for item in items]
        refs = self.jobs.enqueue(rows, dedup_ttl, connection)
        for item, ref in zip(items, refs):
            if not ref.deduplicated:
                self.emit_after("enqueue", item.message, item.delay_ms)
        return refs

    def _row(self, item: EnqueueItem) -> NewJob:
        message = as_message(item.message)
        if any(k in message.options for k in DELIVERY_OPTIONS):
            message = _without_delivery(message)
        path = unstorable_path([message.args, message.kwargs])
        if path is not None:
            where = ("args", *path[1:]) if path[0] == 0 else ("kwargs", *path[1:])
            raise InvalidPayload(
                message.actor_name,
                [{"loc": where, "msg": "contains a NUL character or a lone surrogate, which Postgres cannot store"}],
            )
        self.emit_before("enqueue", message, item.delay_ms)
        actor = self.actors.get(message.actor_name)
        priority = priority_of(message)  # the job's own 0..9; Dramatiq's actor.priority orders no claim
        return {
            "id": message.message_id,
            "queue": q_name(message.queue_name),
            "job": message.actor_name,
            "priority": priority,
            "rank_lead": priority * self.priority_aging,
            "max_attempts": actor.options.get("max_attempts") if actor else None,
            "key": item.key,
            "message": encode_message(message).decode(),
            "error": message.options.get("last_error"),
            "delay": (item.delay_ms or 0) / 1000,
            "group": str(message.options.get("group") or ""),
        }

    # -- worker side ---------------------------------------------------------------

    def start_job(self, message: AnyMessage) -> int:
        """Count the attempt; 0 for a deleted job or a superseded delivery.

        Runs in Dramatiq's ``before_process_message``, which swallows errors:
        every failure here becomes a hand-back (``SkipMessage``), never a run.
        """
        delivery = message.options.get("pg_delivery")
        if delivery is None:
            return 0
        if not self._proven(message, START_GRACE):
            self._abandon(message, "its claim could not be proven durable (Postgres restarted or is away)")
            raise SkipMessage("the claim could not be proven durable")
        deadline = time.monotonic() + START_GRACE
        while True:
            try:
                attempt = self.jobs.start(message.message_id, delivery)
            except Exception as exc:
                if isinstance(exc, DatabaseUnavailable) and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                # Without a counted attempt the job must not run: hand it back.
                message.options["pg_release"] = True
                log_delivery_error(
                    message,
                    f"could not record the start, job handed back: {type(exc).__name__}: {exc}",
                )
                raise SkipMessage("the start could not be recorded") from None
            if attempt == CANCELLED_AT_START:
                message.options[CANCELLED] = True
            return attempt

    def claim_final_failure(self, message: AnyMessage) -> bool:
        """True for the current delivery only (jobs.sql says why the row stays held until the nack).

        When it cannot be written the job must not end: the delivery is
        abandoned (its nack is not written), the row stays held, and the
        orphan pass hands the job out again after the lease.
        """
        delivery = message.options.get("pg_delivery")
        if delivery is None:
            return False
        if not self._proven(message, START_GRACE):  # a finalize delivery has no start that waited for it
            self._abandon(message, "its claim could not be proven durable (Postgres restarted or is away)")
            return False
        deadline = time.monotonic() + START_GRACE
        while True:
            try:
                return self.jobs.claim_final_failure(
                    message.message_id, delivery, message.options.get("last_error") or "failed"
                )
            except Exception as exc:
                if isinstance(exc, DatabaseUnavailable) and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                self._abandon(message, f"its final failure could not be claimed: {type(exc).__name__}: {exc}")
                return False

    # -- the fence of a job's own effects ------------------------------------------------

    def delivery(self, message: AnyMessage) -> int | None:
        delivery: int | None = message.options.get("pg_delivery")
        return delivery

    def is_current(self, message: AnyMessage) -> bool:
        delivery = message.options.get("pg_delivery")
        return delivery is not None and self.jobs.is_current(message.message_id, delivery)

    def complete_in(self, conn: psycopg.Connection[Any], message: AnyMessage) -> None:
        """Complete the job in the caller's transaction (``jobs.sql``'s complete_in_transaction); see the contract."""
        delivery = message.options.get("pg_delivery")
        if delivery is None:
            raise DeliveryFenced("this message came with no delivery of this broker's: nothing to complete")
        self.jobs.complete_in(conn, message.message_id, delivery)

    def completed_in_transaction(self, message: AnyMessage) -> None:
        message.options[COMPLETED] = True

    def completed_in_own_transaction(self, message: AnyMessage) -> bool:
        if message.options.get(COMPLETED):  # ctx.transaction committed it
            return True
        # ctx.complete_in(conn) in a transaction the body made itself: its commit is not seen here, the
        # row is (done by this delivery, or by a newer one, whose hook is not this one's either). Unread
        # (Postgres away): as before this check, the cancel goes on, and its fenced outcome decides.
        try:
            record = self.get_job(message.message_id)
        except Exception as exc:
            log_error(f"job {message.message_id}: its state could not be read before its cancel hook: {exc}")
            return False
        return record is not None and record.state == "completed"

    def _proven(self, message: Any, timeout: float) -> bool:
        return self.proofs.wait(message.options.get("pg_proof", PROVEN), timeout) is True

    def leave_unsettled(self, message: AnyMessage, why: str) -> None:
        if message.options.get("pg_delivery") is not None and not message.options.get(ABANDON):
            self._abandon(message, why)

    def _abandon(self, message: Any, why: str) -> None:
        """Write nothing more for this delivery: the row stays held and the orphan pass hands it out again."""
        message.options[ABANDON] = True
        self.deliveries.abandon(message.message_id, message.options["pg_delivery"])
        log_delivery_error(
            message,
            f"delivery {message.options['pg_delivery']} abandoned, the job runs again after the lease: {why}",
            attempt=message.options.get("attempt"),
        )

    def heartbeat_age(self) -> float | None:
        beat = self.listener.last_beat
        return None if beat == -math.inf else time.monotonic() - beat

    def may_claim(self) -> bool:
        """A worker whose heartbeat is late may be declared dead: claim nothing it could lose."""
        return self.listener.beating(within=self.lease / 2)

    def settle(self, message: Any, status: str, error: str | None) -> None:
        """A delivery's outcome from the consumer (ack, nack, requeue)."""
        delivery = message.options.get("pg_delivery")
        if delivery is None:
            return
        if message.options.get(CANCELLED):
            # Ended cancelled by its start or its cancel outcome (both fenced): nothing more to write.
            self.deliveries.forget(message.message_id, delivery)
            return
        if message.options.get(ABANDON):
            self.deliveries.forget(message.message_id, delivery)  # its last outcome: abandoned when decided
            return
        if message.options.get(COMPLETED):
            # Done in the job's own transaction, which committed: nothing to write, and no refusal to report.
            self.deliveries.forget(message.message_id, delivery)
            return
        if status == "done" and getattr(message, "_exception", None) is not None:
            # It raised, yet no retry was written and it was not failed: something between the run
            # and its outcome broke (Dramatiq swallows middleware errors). Run it again, never "done".
            status = "pending"
        if message.options.get("pg_release"):
            status, error = "pending", None  # never started: hand it back
        if status == "pending" and not self._proven(message, START_GRACE):
            # A hand-back of a claim a crash may have undone could land on someone else's claim:
            # write nothing; the row (if it is still ours) comes back through the orphan pass.
            self.deliveries.drop(message.message_id, delivery)
            log_delivery_error(
                message,
                f"delivery {delivery} not handed back: its claim was never proven durable",
            )
            return
        self.deliveries.settle(message.message_id, delivery, status, error)

    def _retry(self, message: Message[Any], delay: int | None) -> Message[Any]:
        """The retries middleware re-enqueues a current delivery: its row goes back to pending."""
        delivery = message.options["pg_delivery"]
        # Middleware may stamp the message before it is stored (metrics' ready time).
        self.emit_before("enqueue", message, delay)
        stored = _without_delivery(message)
        event = stored.options.pop(PARK, None)
        text = stored.encode().decode()
        seconds = (delay or 0) / 1000
        error = stored.options.get("last_error")
        try:
            if event:
                self.jobs.park(message.message_id, delivery, text, seconds, error, event)
            else:
                self.jobs.retry(message.message_id, delivery, text, seconds, error)
            # The ack Dramatiq sends next must never be written: if a crash
            # undoes this (asynchronous) retry, a "done" would end the job
            # without its retry. Held still, the row then goes back through
            # the orphan pass.
            self.deliveries.abandon(message.message_id, delivery)
        except DatabaseRefused as exc:
            # Refused even as sanitised text: run it again now rather than lose it (the ack that follows is void).
            log_delivery_error(
                message,
                f"the retry could not be stored, the job is handed back instead: {exc}",
                level="error",
                attempt=message.options.get("attempt"),
            )
            self.deliveries.settle(message.message_id, delivery, "pending")
        except Exception:
            # Kept until Postgres is back; it supersedes the ack that follows.
            self.deliveries.put_retry(message.message_id, delivery, Retry(text, time.monotonic() + seconds, error))
        self.emit_after("enqueue", message, delay)
        return message

    def fail_malformed(self, job_id: str, queue: str, job: str, delivery: int, exc: Exception) -> None:
        """A claimed row whose message cannot be decoded fails alone; its hook runs with no payload."""
        error = malformed_error(exc)
        try:
            claimed = self.jobs.fail_malformed(job_id, delivery, error)
        finally:
            # Written, or held still and no longer owned: the orphan pass hands it out again.
            self.deliveries.drop(job_id, delivery)
        log_event("failed", level="error", queue=queue, job=job, job_id=job_id, attempt=None, error=error)
        if claimed:
            self._run_on_dead(job_id, queue, job, None, 0, error)

    def hand_back_unknown(self, job_id: str, delivery: int, message: Message[Any], text: str) -> None:
        """A claimed job of a type this process does not know: back to pending after a delay, unattempted,
        marked on its record. Not written: the row stays held, no longer owned, and the orphan pass hands
        it out again."""
        try:
            self.jobs.retry(job_id, delivery, text, self.unknown_job_delay, unknown_job_error(message.actor_name))
        finally:
            self.deliveries.drop(job_id, delivery)
        announce_unknown_job(self, message, self.unknown_job_delay)

    def _run_on_dead(self, job_id: str, queue: str, job: str, text: str | None, attempt: int, error: str) -> None:
        message = None
        if text is not None:
            with contextlib.suppress(Exception):
                message = dataclasses.replace(Message.decode(text.encode()), message_id=job_id, queue_name=queue)
        if message is None:  # the hook gets no payload
            message = Message(queue_name=queue, actor_name=job, args=(), kwargs={}, options={}, message_id=job_id)
        message.options["attempt"] = attempt
        if self._on_dead is None:
            return
        try:
            self._on_dead(self, message, error)
        except Exception as exc:
            log_event(
                "error",
                level="error",
                queue=queue,
                job=job,
                job_id=job_id,
                attempt=attempt,
                error=f"final-failure handling raised {type(exc).__name__}: {exc}",
            )

    # -- recovery ---------------------------------------------------------------------

    def maintain(self) -> dict[str, list[str]]:
        return self.recovery.maintain(self.listener)

    def recover(self) -> dict[str, list[str]]:
        """One recovery pass now (tests, operators); returns the ids put back to pending, by queue."""
        return self.recovery.recover(own_rows=self.listener.ready.is_set())

    def prune(self) -> int:
        return self.recovery.prune()

    # -- records and operator actions ------------------------------------------------

    def queue_counts(self, queue: str) -> QueueCounts:
        return self.jobs.counts(queue)

    def group_counts(self, queue: str, *, limit: int = 50) -> QueueGroups:
        return self.jobs.group_counts(queue, min(limit, MAX_GROUPS))

    def get_job(self, job_id: str) -> JobRecord | None:
        return self.jobs.get(job_id)

    def list_jobs(self, queue: str, state: str, *, limit: int = 50, offset: int = 0) -> list[JobRecord]:
        check_state(state)
        return self.jobs.list(queue, state, limit, offset)

    def pause_queue(self, queue: str) -> None:
        self.jobs.pause(queue)

    def resume_queue(self, queue: str) -> None:
        self.jobs.resume(queue)

    def set_group_weight(self, queue: str, group: str, weight: int) -> None:
        self.jobs.set_group_weight(queue, group, weight)

    def stored_group_weights(self, queue: str) -> dict[str, int]:
        return self.jobs.group_weights(queue)

    def signal_event(self, name: str, resolution: str, ttl: float) -> int:
        return self.jobs.signal(name, resolution, ttl)

    def resolve_wait(self, job_id: str, name: str, *, timed_out: bool) -> str | None:
        return self.jobs.resolve_wait(job_id, name, timed_out)

    def retry_job(self, job_id: str) -> bool:
        return self.jobs.retry_failed(job_id, None) > 0

    def retry_failed(self, queue: str) -> int:
        return self.jobs.retry_failed(None, queue)

    def delete_job(self, job_id: str) -> bool:
        return self.jobs.delete(job_id)

    def promote_job(self, job_id: str) -> bool:
        return self.jobs.promote(job_id)

    # -- cancel ------------------------------------------------------------------

    def cancel_job(self, job_id: str) -> str | None:
        status = self.jobs.cancel(job_id)
        if status is None:
            return None
        if status == "pending":
            return CancelOutcome.CANCELLED
        if status == "in_progress":
            return CancelOutcome.REQUESTED
        return CancelOutcome.FINISHED

    def cancel_outcome(self, message: AnyMessage, error: str | None = None) -> bool:
        delivery = message.options.get("pg_delivery")
        if delivery is None:
            return False
        ended = self.jobs.cancel_outcome(message.message_id, delivery, error)
        if ended:
            message.options[CANCELLED] = True  # its ack writes nothing
        return ended

    def cancel_requested(self, job_ids: list[str]) -> set[str]:
        return self.jobs.cancel_requested(job_ids) if job_ids else set()

    def cancel_listener(self) -> CancelListener | None:
        if not self.jobs.listens:
            return None  # through a transaction-mode pooler with no listen URL: the watcher polls
        return _PostgresCancels(self.jobs)


class _PostgresCancels:
    """LISTEN on the cancel channel, on a connection of its own."""

    def __init__(self, jobs: Jobs) -> None:
        self.jobs = jobs
        self.conn = jobs.connect_listener()
        try:
            jobs.listen_cancel(self.conn)
        except BaseException:
            self.conn.close()
            raise

    def wait(self, timeout: float) -> list[str]:
        return list(self.jobs.notifications(self.conn, timeout))

    def close(self) -> None:
        self.conn.close()


def _without_delivery(message: Message[Any]) -> Message[Any]:
    options = {k: v for k, v in message.options.items() if k not in (*DELIVERY_OPTIONS, ABANDON, COMPLETED)}
    return dataclasses.replace(message, options=options)

"""A Dramatiq broker on Postgres: one table is the queue (the build-worker design).

``CONVEYOR_BROKER=postgres`` (or no broker and no ``REDIS_URL``) selects it;
the table and its indexes are in ``ledger/migrations/0010_jobs.sql``, the
queries in ``postgres.sql``, the consumer loop in ``postgres_consumer.py``
and the wake-ups and heartbeats in ``postgres_listen.py``.

- **Enqueue** inserts a row, keyed ones atomically with their key, and sends
  ``NOTIFY`` in the same transaction, once per queue. Pass ``connection=``
  to ``app.jobs.enqueue`` to enqueue inside your own transaction: the job
  exists if and only if that transaction commits.
- **Claim** takes up to the prefetch's room in one statement (``FOR UPDATE
  SKIP LOCKED``), FIFO by available time within priority; a **start**
  counts the attempt; outcomes are written in batches.
- **Delays and retries** are the available time of the same row.
- **Recovery** (:meth:`maintain`, every ``CONVEYOR_PG_RECOVERY_SECONDS``,
  in ``postgres_recovery.py``): rows of workers whose heartbeat is older
  than ``CONVEYOR_PG_LEASE_SECONDS`` go back to pending, or fail when their
  attempts are spent, and then their job type's final-failure hook runs once.
- **Records** (``postgres_records.py``): the rows are the job records, listed
  by queue and state; totals live in a small counters table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import psycopg
from dramatiq import Broker, Message
from dramatiq.common import q_name
from dramatiq.errors import ConnectionClosed, QueueJoinTimeout, QueueNotFound
from dramatiq.middleware import SkipMessage
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from ..db import load_queries
from ..errors import BrokerUnavailable, DatabaseUnavailable
from ..logs import log_event
from .base import ConveyorBroker, EnqueueItem, JobRef
from .postgres_consumer import DELIVERY_OPTIONS, Outbox, PostgresConsumer, _Retry
from .postgres_listen import CHANNEL, Listener
from .postgres_records import RecordsMixin
from .postgres_recovery import RecoveryMixin

QUERIES = load_queries(Path(__file__).with_name("postgres.sql"))

#: Connections per broker pool: a worker process's threads each need one
#: briefly to start a job; producers one per concurrent enqueue.
POOL_MAX = 16

#: Seconds to wait for a pooled connection before calling Postgres unavailable.
POOL_TIMEOUT = 5.0

#: Seconds a job's start waits for Postgres to come back before the job is handed back unstarted.
START_GRACE = 5.0

#: Rounds of insert / look up / release an expired key, for keys raced by other enqueuers.
KEY_ROUNDS = 5

#: Slots of conveyor_queue_totals (see the migration).
TOTAL_SLOTS = 8

#: Whether a worker's own writes (claims, starts, outcomes, retries) wait for
#: the WAL flush. They do not: each of them, lost in a Postgres crash, only
#: makes a job run once more (a claim or an outcome undone) or counts one
#: attempt less, which at-least-once delivery and idempotent processors
#: already cover; waiting would add an fsync to every start of every job.
#: Enqueues, final failures and recovery always commit synchronously.
WORKER_SYNCHRONOUS_COMMIT = False

#: Errors that mean "Postgres is not reachable right now"; anything else is a bug or bad data.
DB_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout, PoolClosed)


class PostgresBroker(RecoveryMixin, RecordsMixin, ConveyorBroker, Broker):
    """Dramatiq broker plus conveyor's job interface, on one Postgres table.

    ``on_dead(broker, message, error)`` runs a job's final failure found by
    recovery or at claim (undecodable message); by default the callback the
    Retries middleware runs (``App.final_failure``).
    """

    transactional_enqueue = True
    db_errors = DB_ERRORS

    def __init__(self, database_url: str, *, middleware: list | None = None, settings: Any = None,
                 on_dead: Callable[[Any, Any, str], None] | None = None) -> None:
        super().__init__(middleware=middleware)
        if settings is None:
            from ..settings import Settings

            settings = Settings()
        self.database_url = database_url
        self.queues: set[str] = set()
        self.poll_seconds = settings.pg_poll_seconds
        self.recovery_seconds = settings.pg_recovery_seconds
        self.lease = settings.pg_lease_seconds
        self.retention = settings.retention
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._on_dead = on_dead or _retries_callback(self.middleware)
        self._lock = threading.RLock()
        self._pools: dict[bool, ConnectionPool] = {}  # fast -> pool
        self._pool_checked = -math.inf
        self._listener = self._new_listener()
        self._consumed: set[str] = set()
        self._outbox = Outbox()
        self._held: dict[str, int] = {}  # job id -> delivery, claimed here and without an outcome yet
        self._maintaining = threading.Lock()
        self._last_recovery = -math.inf
        self._last_prune = -math.inf

    def _new_listener(self) -> Listener:
        return Listener(connect=self._connect, on_connect=_listen, heartbeat=self._heartbeat,
                        heartbeat_interval=self.lease / 3)

    # -- connections -----------------------------------------------------------

    def _connect(self) -> psycopg.Connection:
        # Keepalives: a listener on a dead network path notices within ~15 s.
        return psycopg.connect(self.database_url, autocommit=True, connect_timeout=5, keepalives=1,
                               keepalives_idle=5, keepalives_interval=2, keepalives_count=3)

    @contextlib.contextmanager
    def _conn(self, *, fast: bool = False) -> Iterator[psycopg.Connection]:
        """A pooled autocommit connection. No ping on checkout: a connection a
        Postgres restart broke fails once, and the pool is then checked.

        ``fast`` connections commit asynchronously (see WORKER_SYNCHRONOUS_COMMIT).
        """
        fast = fast and not WORKER_SYNCHRONOUS_COMMIT
        with self._lock:
            pool = self._pools.get(fast)
            if pool is None:
                pool = self._pools[fast] = ConnectionPool(
                    self.database_url, min_size=1, max_size=POOL_MAX, open=False, kwargs={"autocommit": True},
                    name="conveyor-pg-worker" if fast else "conveyor-pg-broker", timeout=POOL_TIMEOUT,
                    reconnect_timeout=60, configure=_worker_session if fast else None)
                pool.open(wait=False)
        with pool.connection() as conn:
            yield conn

    def _pool_trouble(self) -> None:
        """After a connection error: replace the pools' broken connections (at most once a second)."""
        now = time.monotonic()
        if now - self._pool_checked < 1.0:
            return
        self._pool_checked = now
        for pool in list(self._pools.values()):
            try:
                pool.check()
            except Exception:  # the pool reconnects by itself; checking is only a shortcut
                pass

    def _execute(self, name: str, params: dict | None = None, *, fetch: str = "none", fast: bool = False) -> Any:
        with self._conn(fast=fast) as conn:
            cur = conn.execute(QUERIES[name], params or {})
            if fetch == "one":
                return cur.fetchone()
            if fetch == "all":
                return cur.fetchall()
            return cur.rowcount

    def _slot(self) -> int:
        return random.randrange(TOTAL_SLOTS)

    def _read(self, name: str, params: dict, fetch: str) -> Any:
        """Run a statement that is safe to repeat; once more on a fresh connection if the first one was broken."""
        for attempt in (1, 2):
            try:
                return self._execute(name, params, fetch=fetch)
            except DB_ERRORS as exc:
                self._pool_trouble()
                if attempt == 2 or isinstance(exc, PoolTimeout):  # no connection for seconds: not a stale one
                    raise DatabaseUnavailable(f"Postgres is unavailable: {exc}") from exc

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
            if not self._listener.is_alive():
                self._listener.start()
        # Claim nothing before this worker's heartbeat row exists: recovery
        # would take the claims of a worker it cannot see.
        if not self._listener.ready.wait(POOL_TIMEOUT):
            raise ConnectionClosed(f"Postgres is unavailable: {self._listener.last_error}")
        return PostgresConsumer(self, queue_name, prefetch, timeout)

    def enqueue(self, message: Message, *, delay: int | None = None) -> Message:
        """Dramatiq's enqueue: a new job, or (for a message of a current delivery) its retry."""
        if "pg_delivery" in message.options:
            return self._retry(message, delay)
        self.enqueue_jobs([EnqueueItem(message, None, delay)], dedup_ttl=1)
        return message

    def close(self) -> None:
        """Stop listening and heartbeating, write pending outcomes, leave. The broker can be used again."""
        with self._lock:
            listener, self._listener = self._listener, self._new_listener()
            self._consumed.clear()
        listener.stop()
        try:
            self._outbox.write(self)
        except DB_ERRORS as exc:
            log_event("error", level="warning", queue=None, job=None, job_id=None, attempt=None,
                      error=f"outcomes of {len(self._outbox.job_ids())} job(s) not written, recovery "
                            f"will hand them out again: {exc}")
        if listener.ready.is_set():
            # Gone for good: its leftover rows are recovered at the next pass, not after the lease.
            with contextlib.suppress(*DB_ERRORS):
                self._execute("forget_worker", {"id": self.worker_id})
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close(timeout=5)

    def flush(self, queue_name: str) -> None:
        self._execute("flush", {"queue": q_name(queue_name)})

    def flush_all(self) -> None:
        for queue in self.queues:
            self.flush(queue)

    def join(self, queue_name: str, *, interval: int = 100, timeout: int | None = None) -> None:
        """Wait until ``queue_name`` has no pending or running job (tests)."""
        deadline = timeout and time.monotonic() + timeout / 1000
        while self._execute("unfinished", {"queue": q_name(queue_name)}, fetch="one")[0]:
            if deadline and time.monotonic() >= deadline:
                raise QueueJoinTimeout(queue_name)
            time.sleep(interval / 1000)

    # -- enqueue -----------------------------------------------------------------

    def enqueue_jobs(self, items: list[EnqueueItem], *, dedup_ttl: float,
                     connection: psycopg.Connection | None = None) -> list[JobRef]:
        """Insert jobs; with ``connection``, inside the caller's transaction (a savepoint if one is open)."""
        rows = [self._row(item) for item in items]
        if connection is not None:
            try:
                with connection.transaction():
                    refs = self._insert(connection, rows, dedup_ttl)
            except DB_ERRORS as exc:
                raise BrokerUnavailable(f"Postgres is unavailable, nothing was enqueued: {exc}") from exc
        else:
            refs = self._insert_on_own_connection(rows, dedup_ttl)
        for item, ref in zip(items, refs):
            if not ref.deduplicated:
                self.emit_after("enqueue", item.message, item.delay_ms)
        return refs

    def _insert_on_own_connection(self, rows: list[dict], dedup_ttl: float) -> list[JobRef]:
        # A pooled connection a Postgres restart broke fails before anything
        # was sent: then try once more. A failure at COMMIT is ambiguous and
        # is reported, never repeated (without a key it could enqueue twice).
        attempt = 1
        while True:
            committing = False
            try:
                with self._conn() as conn:
                    with conn.transaction():
                        refs = self._insert(conn, rows, dedup_ttl)
                        committing = True
                return refs
            except DB_ERRORS as exc:
                self._pool_trouble()
                if committing or attempt == 2 or isinstance(exc, PoolTimeout):
                    raise BrokerUnavailable(f"Postgres is unavailable, nothing was enqueued: {exc}") from exc
                attempt += 1

    def _row(self, item: EnqueueItem) -> dict:
        message = item.message
        if any(k in message.options for k in DELIVERY_OPTIONS):
            message = _without_delivery(message)
        self.emit_before("enqueue", message, item.delay_ms)
        actor = self.actors.get(message.actor_name)
        return {
            "id": message.message_id,
            "queue": q_name(message.queue_name),
            "job": message.actor_name,
            "priority": actor.priority if actor else 0,
            "max_attempts": actor.options.get("max_attempts") if actor else None,
            "key": item.key,
            "message": message.encode().decode(),
            "error": message.options.get("last_error"),
            "delay": (item.delay_ms or 0) / 1000,
        }

    def _insert(self, conn: psycopg.Connection, rows: list[dict], dedup_ttl: float) -> list[JobRef]:
        refs: list[JobRef | None] = [None] * len(rows)
        todo = list(range(len(rows)))
        for _ in range(KEY_ROUNDS):
            # Keys in one order in every transaction: two batches racing for
            # the same keys then wait on each other instead of deadlocking.
            batch = sorted((rows[i] for i in todo), key=lambda r: r["key"] or "")
            inserted = {row[0] for row in conn.execute(QUERIES["enqueue"], _enqueue_params(batch, dedup_ttl))}
            skipped = []
            for i in todo:
                if rows[i]["id"] in inserted:
                    refs[i] = JobRef(rows[i]["id"], False)
                else:
                    skipped.append(i)
            keys = sorted({rows[i]["key"] for i in skipped if rows[i]["key"]})
            holders = {}
            if keys:
                holders = {key: (job_id, live) for key, job_id, live in
                           conn.execute(QUERIES["key_holders"], {"keys": keys})}
            todo = []
            for i in skipped:
                key = rows[i]["key"]
                if key is None:  # this very message (same id) was enqueued before
                    refs[i] = JobRef(rows[i]["id"], True)
                elif key in holders and holders[key][1]:
                    refs[i] = JobRef(holders[key][0], True)
                else:  # the holder's TTL is over, or it was just deleted: take the key
                    todo.append(i)
            expired = [key for key, (_, live) in holders.items() if not live]
            if expired:
                conn.execute(QUERIES["release_expired_keys"], {"keys": expired})
            if not todo:
                return refs  # type: ignore[return-value]
        raise BrokerUnavailable(f"could not settle the keys of {len(todo)} job(s) against concurrent "
                                f"enqueues in {KEY_ROUNDS} rounds; nothing was enqueued")

    # -- worker side ---------------------------------------------------------------

    def start_job(self, message: Any) -> int:
        delivery = message.options.get("pg_delivery")
        if delivery is None:
            return 0
        deadline = time.monotonic() + START_GRACE
        while True:
            try:
                row = self._execute("start", {"id": message.message_id, "delivery": delivery}, fetch="one",
                                    fast=True)
                return row[0] if row else 0
            except DB_ERRORS as exc:
                self._pool_trouble()
                if time.monotonic() >= deadline:
                    # Without a counted attempt the job must not run: hand it back.
                    message.options["pg_release"] = True
                    log_event("error", level="warning", queue=q_name(message.queue_name), job=message.actor_name,
                              job_id=message.message_id, attempt=None,
                              error=f"could not record the start, job handed back: {type(exc).__name__}")
                    raise SkipMessage("Postgres is unavailable") from None
                time.sleep(0.2)

    def claim_final_failure(self, message: Any) -> bool:
        deadline = time.monotonic() + START_GRACE
        while True:
            try:
                return self._execute("claim_final_failure", {"id": message.message_id}, fetch="one") is not None
            except DB_ERRORS:
                self._pool_trouble()
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def _may_claim(self) -> bool:
        # A worker whose heartbeat is late may be declared dead: claim nothing it could lose.
        return self._listener.beating(within=self.lease / 2)

    def _claim_rows(self, queue: str, limit: int) -> list[tuple]:
        rows = self._execute("claim", {"queue": queue, "limit": limit, "worker": self.worker_id}, fetch="all",
                             fast=True)
        rows.sort(key=lambda r: (r[4], r[5]))  # RETURNING has no order: FIFO within priority
        return [(r[0], r[1], r[2], r[3], r[6]) for r in rows]

    def _next_due(self, queue: str) -> float | None:
        return self._execute("next_due", {"queue": queue}, fetch="one", fast=True)[0]

    def _hold(self, job_id: str, delivery: int) -> None:
        with self._lock:
            self._held[job_id] = delivery

    def _settle(self, job_id: str, delivery: int, status: str, error: str | None) -> None:
        self._outbox.put(job_id, delivery, status, error)
        with self._lock:
            if self._held.get(job_id) == delivery:
                del self._held[job_id]

    def _write_outcomes(self, outcomes: dict[tuple[str, int], tuple[str, str | None]]) -> None:
        keys = list(outcomes)
        self._execute("finish", {
            "ids": [k[0] for k in keys], "deliveries": [k[1] for k in keys],
            "statuses": [outcomes[k][0] for k in keys], "errors": [outcomes[k][1] for k in keys],
            "slot": self._slot(),
        }, fast=True)

    def _retry(self, message: Message, delay: int | None) -> Message:
        delivery = message.options["pg_delivery"]
        # Middleware may stamp the message before it is stored (metrics' ready time).
        self.emit_before("enqueue", message, delay)
        stored = _without_delivery(message)
        seconds = (delay or 0) / 1000
        try:
            self._write_retry(message.message_id, delivery, stored.encode().decode(), seconds,
                              stored.options.get("last_error"))
        except DB_ERRORS:
            # Kept until Postgres is back; it supersedes the ack that follows.
            self._pool_trouble()
            self._outbox.put_retry(message.message_id, delivery,
                                   _Retry(stored.encode().decode(), time.time() + seconds,
                                          stored.options.get("last_error")))
        self.emit_after("enqueue", message, delay)
        return message

    def _write_retry(self, job_id: str, delivery: int, message: str, delay: float, error: str | None) -> None:
        self._execute("retry", {"id": job_id, "delivery": delivery, "delay": delay, "message": message,
                                "error": error, "channel": CHANNEL}, fast=True)

    def _heartbeat(self, conn: psycopg.Connection) -> None:
        conn.execute(QUERIES["heartbeat"], {"id": self.worker_id, "hostname": socket.gethostname(),
                                            "pid": os.getpid(), "queues": sorted(self._consumed)})

def _enqueue_params(rows: list[dict], dedup_ttl: float) -> dict:
    return {
        "ids": [r["id"] for r in rows], "queues": [r["queue"] for r in rows], "jobs": [r["job"] for r in rows],
        "priorities": [r["priority"] for r in rows], "max_attempts": [r["max_attempts"] for r in rows],
        "keys": [r["key"] for r in rows], "messages": [r["message"] for r in rows],
        "errors": [r["error"] for r in rows], "delays": [r["delay"] for r in rows],
        "dedup_ttl": float(dedup_ttl), "channel": CHANNEL,
    }


def _without_delivery(message: Message) -> Message:
    options = {k: v for k, v in message.options.items() if k not in DELIVERY_OPTIONS}
    return dataclasses.replace(message, options=options)


def _worker_session(conn: psycopg.Connection) -> None:
    conn.execute(QUERIES["worker_session"])


def _listen(conn: psycopg.Connection) -> None:
    conn.execute(QUERIES["listen"])


def _retries_callback(middleware: list) -> Callable[[Any, Any, str], None] | None:
    from .middleware.retries import Retries

    for m in middleware:
        if isinstance(m, Retries):
            return m.on_final_failure
    return None

"""The one class that talks to Postgres for the broker: :class:`Jobs`.

It owns the named queries (``jobs.sql`` beside it), the connection pools,
and the translation of every psycopg error into conveyor's error tree
(``conveyor.db.translate``), where it enters: :class:`~conveyor.errors.DatabaseUnavailable` when
Postgres cannot be reached (or lost the connection, or timed out: try
again later), :class:`~conveyor.errors.DatabaseRefused` when it refused a
statement (a retry cannot help), :class:`~conveyor.errors.BrokerUnavailable`
for an enqueue. The broker (Dramatiq's adapter), the consumer loop, the
listener and recovery call its methods and never touch psycopg.

Every write that belongs to one delivery of a job (start, outcome, retry,
final-failure claim) names the delivery number its claim returned, and
matches no row once that delivery is superseded.

**Durability.** The delivery number is the fence, and a number that a
crash could roll back would be handed out again: worker A claims delivery 7
and runs the job, Postgres crashes before the claim reached the disk,
after the restart worker B claims the same job and gets delivery 7 again,
and A's outcome then lands on B's claim while B still runs (and a retry of
A's starts a third run). So no job starts before its claim is on disk:
claims commit asynchronously and ``durability.py`` proves each batch
durable with one synchronous commit on a thread of its own (or, without
that thread's connection, the claim itself commits synchronously).
Everything else a worker writes commits asynchronously, because none of it
can make a number repeat: an outcome or retry lost in a crash leaves the
row held by its (durable) claim, and the worker's orphan pass or recovery
hands it out again under a new delivery; a start lost in a crash counts
one attempt less. A final-failure claim is written synchronously; the
failure itself comes with the nack after the hooks, so a crash before it
runs the hooks again (at least once), never the body.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator, Literal, TypedDict, overload

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import PoolTimeout

from conveyor.brokers.base import GroupCounts, JobRecord, JobRef, QueueCounts, QueueGroups
from conveyor.brokers.postgres.records import LISTS, job_record
from conveyor.db import (
    STATEMENT_ERRORS,
    UNAVAILABLE,
    ReplyDeadline,
    ShieldedPool,
    load_queries,
    through_pooler,
    translate,
)
from conveyor.errors import (
    BrokerUnavailable,
    DatabaseRefused,
    DatabaseUnavailable,
    DeliveryFenced,
    EnqueueOutcomeUnknown,
    NotInTransaction,
)

QUERIES = load_queries(Path(__file__).with_name("jobs.sql"))

#: A row as psycopg returns it (the default row factory).
Row = tuple[Any, ...]
#: What a statement's caller wants back: its rowcount, its first row, or all its rows.
Fetch = Literal["none", "one", "all"]

#: The NOTIFY channel; the payload is the queue name. ``LISTEN`` in jobs.sql names it too.
CHANNEL = "conveyor_jobs"
#: The channel a cancellation of a held job is announced on (payload: the job id); jobs.sql listen_cancel.
CANCEL_CHANNEL = "conveyor_cancel"

#: Connections per pool: a worker process's threads each need one briefly to start a job.
POOL_MAX = 16

#: Seconds to wait for a pooled connection before calling Postgres unavailable.
POOL_TIMEOUT = 5.0

#: Rounds of insert / look up / release an expired key, for keys raced by other enqueuers.
KEY_ROUNDS = 5

#: Slots of conveyor_queue_totals (see the migration) that the worker's batched outcomes pick at random.
TOTAL_SLOTS = 8

#: Slots after those that completions in a job's own transaction use, one per connection (backend pid
#: modulo this): such a completion holds its row until the job's commit, so two connections share one
#: only when their pids collide. Bounds the rows per queue that ``counts`` sums (~1,000 at most).
CONNECTION_SLOTS = 1024


class NewJob(TypedDict):
    """One job to insert, as the broker builds it from an enqueue (``PostgresBroker._row``)."""

    id: str
    queue: str
    job: str
    #: 0..9, higher first (the enqueue's priority).
    priority: int
    #: Seconds the job's rank is ahead of its available time: priority x CONVEYOR_PRIORITY_AGING_SECONDS.
    rank_lead: float
    #: None when the actor has no such option.
    max_attempts: int | None
    key: str | None
    #: The Dramatiq message, encoded.
    message: str
    error: str | None
    #: Seconds until it may run.
    delay: float
    #: Its fair-share group ('': the default group, jobs enqueued without one).
    group: str


class ConnectionOptions(TypedDict):
    """libpq connection parameters, passed through by psycopg."""

    connect_timeout: int
    keepalives: int
    keepalives_idle: int
    keepalives_interval: int
    keepalives_count: int
    tcp_user_timeout: int


#: Every connection's options. Keepalives and the TCP user timeout: a connection on a
#: dead network path fails within ~15 s instead of hanging the consumer (and the jobs
#: it claimed) for good.
CONNECTION: ConnectionOptions = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 15000,
}


def storable(text: str | None) -> str | None:
    """``text`` as Postgres can store it: NUL and lone surrogates written out as escapes.

    Error texts come from anywhere (a processor's exception, a provider's
    reply); Postgres rejects NUL in text and jsonb, and UTF-8 has no lone
    surrogates. Anything else is kept as it is.
    """
    if text is None or (text.isascii() and "\x00" not in text):
        return text
    text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def storable_json(value: Any) -> Any:
    """``value`` (decoded JSON) with every string, keys too, made :func:`storable`."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, list):
        return [storable_json(v) for v in value]
    if isinstance(value, dict):
        return {storable(k): storable_json(v) for k, v in value.items()}
    return value


def unstorable_path(value: Any, path: tuple[int | str, ...] = ()) -> tuple[int | str, ...] | None:
    """Where in ``value`` a string Postgres cannot store sits (a NUL, a lone surrogate), or None."""
    if isinstance(value, str):
        return None if storable(value) == value else path
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = unstorable_path(v, (*path, i))
            if found is not None:
                return found
    if isinstance(value, dict):
        for k, v in value.items():
            found = unstorable_path(k, (*path, "<key>")) if isinstance(k, str) else None
            found = found if found is not None else unstorable_path(v, (*path, k))
            if found is not None:
                return found
    return None


#: Whether a worker's claims, starts, outcomes and retries wait for the WAL
#: flush. They do not: the Jobs class says why losing a start, an outcome or a retry
#: in a crash only makes a job run once more (or count one attempt less), and
#: claims are proven durable per batch before their jobs start (durability.py).
WORKER_SYNCHRONOUS_COMMIT = False  # bench/pg_quick.py flips it


def _sync_worker_commits() -> bool:
    return WORKER_SYNCHRONOUS_COMMIT  # read at each pool's opening, so a flip before it counts


class Jobs:
    """Data access for the jobs table: pools, queries, error translation. Thread-safe."""

    def __init__(
        self,
        database_url: str,
        worker_id: str,
        *,
        pooled: bool = False,
        listen_url: str | None = None,
        enqueue_timeout: float = 30.0,
    ) -> None:
        self.database_url = database_url
        #: Seconds an enqueue's transaction may wait for Postgres's answers (settings.pg_enqueue_timeout).
        self.enqueue_timeout = enqueue_timeout
        self.worker_id = worker_id
        #: database_url goes through a transaction-mode pooler: no prepared statements, no session settings.
        self.pooled = pooled
        #: Where the listener connects: a direct URL when given (LISTEN needs a session), else database_url.
        self.listen_url = listen_url or database_url
        #: False when the only way in is a transaction-mode pooler: notifications would be lost, poll instead.
        self.listens = bool(listen_url) or not pooled
        self._options: dict[str, Any] = {**CONNECTION, **through_pooler(pooled)}
        self._lock = threading.Lock()
        self._pools: dict[bool, ShieldedPool] = {}  # fast -> pool
        self._pool_checked = -math.inf
        #: Queues seen with named groups: claimed by claim_groups from then on.
        self._grouped: set[str] = set()

    # -- connections -----------------------------------------------------------

    def connect(self) -> psycopg.Connection[Any]:
        """A connection of its own (the claim prover's)."""
        try:
            return psycopg.connect(self.database_url, autocommit=True, **self._options)
        except STATEMENT_ERRORS as exc:
            raise translate(exc, "connecting") from exc

    def connect_listener(self) -> psycopg.Connection[Any]:
        """The listener's connection: direct to Postgres when a listen URL is set (LISTEN needs a session)."""
        pooled = self.pooled and self.listen_url == self.database_url
        options = {**CONNECTION, **through_pooler(pooled)}
        try:
            conn = psycopg.connect(self.listen_url, autocommit=True, **options)
            if not pooled and not _sync_worker_commits():
                # The heartbeat need not wait for a WAL flush queued behind the jobs' commits: one lost in
                # a crash only makes this worker look older, and after a restart recovery waits a lease.
                _worker_session(conn)
            return conn
        except STATEMENT_ERRORS as exc:
            raise translate(exc, "connecting") from exc

    @contextlib.contextmanager
    def _conn(self, *, fast: bool = False) -> Iterator[psycopg.Connection[Any]]:
        """A pooled autocommit connection. No ping on checkout: a connection a
        Postgres restart broke fails once, and the pools are then checked.

        ``fast`` connections commit asynchronously (see the module docstring).
        """
        # Through a transaction-mode pooler a session setting would stick to whichever server
        # connection ran it: one pool, no settings, the server's synchronous_commit for everything.
        fast = fast and not _sync_worker_commits() and not self.pooled
        with self._lock:
            pool = self._pools.get(fast)
            if pool is None:
                pool = self._pools[fast] = ShieldedPool(
                    self.database_url,
                    min_size=1,
                    max_size=POOL_MAX,
                    open=False,
                    kwargs={"autocommit": True, **self._options},
                    name="conveyor-pg-worker" if fast else "conveyor-pg-broker",
                    timeout=POOL_TIMEOUT,
                    reconnect_timeout=60,
                    configure=None if self.pooled else _worker_session if fast else _durable_session,
                )
                pool.open(wait=False)
        with pool.connection() as conn:
            yield conn

    def trouble(self) -> None:
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

    def close(self) -> None:
        """Close the pools; the next call opens new ones."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close(timeout=5)

    @overload
    def _execute(
        self, name: str, params: dict[str, Any] | None = None, *, fetch: Literal["none"] = "none", fast: bool = False
    ) -> int: ...

    @overload
    def _execute(
        self, name: str, params: dict[str, Any] | None = None, *, fetch: Literal["one"], fast: bool = False
    ) -> Row | None: ...

    @overload
    def _execute(
        self, name: str, params: dict[str, Any] | None = None, *, fetch: Literal["all"], fast: bool = False
    ) -> list[Row]: ...

    def _execute(
        self, name: str, params: dict[str, Any] | None = None, *, fetch: Fetch = "none", fast: bool = False
    ) -> int | Row | None | list[Row]:
        try:
            with self._conn(fast=fast) as conn:
                cur = conn.execute(QUERIES[name], params or {})
                if fetch == "one":
                    return cur.fetchone()
                if fetch == "all":
                    return cur.fetchall()
                return cur.rowcount
        except STATEMENT_ERRORS as exc:
            if isinstance(exc, UNAVAILABLE):
                self.trouble()
            raise translate(exc, name.replace("_", " ")) from exc

    @overload
    def _read(self, name: str, params: dict[str, Any], fetch: Literal["none"]) -> int: ...

    @overload
    def _read(self, name: str, params: dict[str, Any], fetch: Literal["one"]) -> Row | None: ...

    @overload
    def _read(self, name: str, params: dict[str, Any], fetch: Literal["all"]) -> list[Row]: ...

    def _read(self, name: str, params: dict[str, Any], fetch: Fetch) -> int | Row | None | list[Row]:
        """A statement that is safe to repeat: once more on a fresh connection if the first one was broken."""
        try:
            return self._execute(name, params, fetch=fetch)
        except DatabaseUnavailable as exc:
            if isinstance(exc.__cause__, PoolTimeout):  # no connection for seconds: not a stale one
                raise
            return self._execute(name, params, fetch=fetch)

    @staticmethod
    def slot() -> int:
        return random.randrange(TOTAL_SLOTS)

    # -- enqueue -----------------------------------------------------------------

    def enqueue(
        self, rows: list[NewJob], dedup_ttl: float, connection: psycopg.Connection[Any] | None = None
    ) -> list[JobRef]:
        """Insert jobs (rows as the broker builds them); with ``connection``, inside the caller's transaction."""
        if connection is not None:
            try:
                with connection.transaction():
                    return self._insert(connection, rows, dedup_ttl)
            except STATEMENT_ERRORS as exc:
                raise _enqueue_error(exc) from exc
        # A pooled connection a Postgres restart broke fails before anything
        # was sent: then try once more. A failure at COMMIT is ambiguous and
        # is reported, never repeated (without a key it could enqueue twice).
        # A reply that never comes is bounded by ReplyDeadline (enqueue_timeout): unanswered before the
        # COMMIT was sent, the transaction dies with its connection (nothing enqueued); at the COMMIT,
        # the outcome is unknown.
        attempt = 1
        while True:
            committing = False
            deadline: ReplyDeadline | None = None
            try:
                with self._conn() as conn, ReplyDeadline(conn, self.enqueue_timeout) as deadline:
                    with conn.transaction():
                        refs = self._insert(conn, rows, dedup_ttl)
                        committing = True
                return refs
            except STATEMENT_ERRORS as exc:
                if not isinstance(exc, UNAVAILABLE):
                    raise _enqueue_error(exc) from exc
                self.trouble()
                if deadline is not None and deadline.expired:
                    if committing:
                        raise EnqueueOutcomeUnknown(
                            f"Postgres did not answer the enqueue's COMMIT within {self.enqueue_timeout:g} s "
                            f"(CONVEYOR_PG_ENQUEUE_TIMEOUT): the job(s) may have been enqueued; enqueue them "
                            f"again only with a key"
                        ) from exc
                    raise BrokerUnavailable(
                        f"Postgres did not answer the enqueue within {self.enqueue_timeout:g} s "
                        f"(CONVEYOR_PG_ENQUEUE_TIMEOUT); it never committed, nothing was enqueued"
                    ) from exc
                if committing:
                    raise EnqueueOutcomeUnknown(
                        f"{translate(exc, 'the enqueue')}; the connection broke while "
                        f"it committed, so the job(s) may have been enqueued; enqueue them again only with a key"
                    ) from exc
                if attempt == 2 or isinstance(exc, PoolTimeout):
                    raise _enqueue_error(exc) from exc
                attempt += 1

    def _insert(self, conn: psycopg.Connection[Any], rows: list[NewJob], dedup_ttl: float) -> list[JobRef]:
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
            keys = sorted({key for i in skipped if (key := rows[i]["key"])})
            holders = {}
            if keys:
                holders = {
                    key: (job_id, live) for key, job_id, live in conn.execute(QUERIES["key_holders"], {"keys": keys})
                }
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
        raise BrokerUnavailable(
            f"could not settle the keys of {len(todo)} job(s) against concurrent "
            f"enqueues in {KEY_ROUNDS} rounds; nothing was enqueued"
        )

    # -- one delivery's life ------------------------------------------------------

    def claim(
        self,
        queue: str,
        limit: int,
        *,
        synchronous: bool,
        group_cap: int | None = None,
        group_weights: dict[str, int] | None = None,
    ) -> list[tuple[str, str, str, int, str, bool]]:
        """Claim up to ``limit`` runnable jobs, lowest rank first (priority with aging): (id, queue, job,
        delivery, message, finalize). ``finalize``: the job failed for good and its final-failure hooks are to run (only them).

        A queue with named groups is claimed by :meth:`claim_groups` (fair shares; ``group_cap`` jobs of
        one group held at once at most; ``group_weights``: the queue's settings' weights, which win over
        those stored). ``synchronous=False``: the caller proves the claim durable
        before its jobs start (durability.py).
        """
        if queue in self._grouped:
            return self.claim_groups(
                queue, limit, synchronous=synchronous, group_cap=group_cap, group_weights=group_weights
            )
        rows = self._execute(
            "claim", {"queue": queue, "limit": limit, "worker": self.worker_id}, fetch="all", fast=not synchronous
        )
        rows.sort(key=lambda r: (r[4], r[5]))  # RETURNING has no order: rank, then higher priority
        claimed = [(r[0], r[1], r[2], r[3], r[6], r[7]) for r in rows]
        # A queue turns grouped with its first named group: each claimed row says so, and a short
        # claim (none, or too few: the grouped jobs are not the plain claim's) looks it up.
        # Once grouped, a queue stays so (prune_groups never deletes its default group's row).
        short = len(claimed) < limit
        if any(r[8] for r in rows) or (
            short and _single(self._execute("has_groups", {"queue": queue}, fetch="one"), "groups")[0]
        ):
            self._grouped.add(queue)
            if short:
                claimed += self.claim_groups(
                    queue,
                    limit - len(claimed),
                    synchronous=synchronous,
                    group_cap=group_cap,
                    group_weights=group_weights,
                )
        return claimed

    def claim_groups(
        self,
        queue: str,
        limit: int,
        *,
        synchronous: bool,
        group_cap: int | None,
        group_weights: dict[str, int] | None = None,
    ) -> list[tuple[str, str, str, int, str, bool]]:
        """The claim of a queue with named groups: groups served in turn by weight (a group of weight 3
        gets three turns to a group of weight 1's: stride scheduling, migration 0077), each group's jobs
        in the queue's order, at most ``group_cap`` held per named group fleet-wide (lock_groups,
        claim_groups in jobs.sql). ``group_weights`` (the queue's settings) win over the weights stored
        (:meth:`set_group_weight`). Returns what :meth:`claim` does, interleaved by group."""
        params = {
            "queue": queue,
            "limit": limit,
            "worker": self.worker_id,
            "cap": group_cap,
            "configured": json.dumps(group_weights) if group_weights else None,
        }
        try:
            with self._conn(fast=not synchronous) as conn:
                with conn.transaction():
                    # Group locks only where there are slots to count (a cap): else claimers share groups.
                    rotation = QUERIES["lock_groups" if group_cap is not None else "pick_groups"]
                    turns = conn.execute(rotation, params).fetchall()  # (group, start, weight), lowest pass first
                    if not turns:
                        return []
                    picks = {
                        "groups": [t[0] for t in turns],
                        "starts": [t[1] for t in turns],
                        "weights": [t[2] for t in turns],
                    }
                    rows = conn.execute(QUERIES["claim_groups"], {**params, **picks}).fetchall()
        except STATEMENT_ERRORS as exc:
            if isinstance(exc, UNAVAILABLE):
                self.trouble()
            raise translate(exc, "claim") from exc
        rows.sort(key=lambda r: (r[4], r[5]))  # RETURNING has no order: by virtual finish time, then rotation
        return [(r[0], r[1], r[2], r[3], r[6], r[7]) for r in rows]

    def is_grouped(self, queue: str) -> bool:
        """True once this process has seen the queue have named groups (its claims are claim_groups')."""
        return queue in self._grouped

    def next_due(self, queue: str) -> float | None:
        due: float | None = _single(self._execute("next_due", {"queue": queue}, fetch="one", fast=True), "next_due")[0]
        return due

    def start(self, job_id: str, delivery: int) -> int:
        """Count the attempt of a claimed job; 0 when it was deleted or the delivery is superseded,
        CANCELLED_AT_START when its cancellation was asked (the start ended it cancelled)."""
        row = self._execute("start", {"id": job_id, "delivery": delivery}, fetch="one", fast=True)
        attempt: int = row[0] if row else 0
        return attempt

    def finish(self, outcomes: dict[tuple[str, int], tuple[str, str | None]]) -> int:
        """Apply outcomes {(id, delivery): (status, error)} of current deliveries in one statement."""
        keys = list(outcomes)
        row = self._execute(
            "finish",
            {
                "ids": [k[0] for k in keys],
                "deliveries": [k[1] for k in keys],
                "statuses": [outcomes[k][0] for k in keys],
                "errors": [storable(outcomes[k][1]) for k in keys],
                "slot": self.slot(),
            },
            fetch="one",
            fast=True,
        )
        moved: int = _single(row, "finish")[0]
        return moved

    def complete_in(self, conn: psycopg.Connection[Any], job_id: str, delivery: int) -> None:
        """Complete the job in ``conn``'s open transaction while ``delivery`` is current, else DeliveryFenced."""
        if conn.info.transaction_status != TransactionStatus.INTRANS:
            raise NotInTransaction(
                "the job's completion needs an open transaction on the connection, the one its effects are written in"
            )
        try:
            row = conn.execute(
                QUERIES["complete_in_transaction"],
                {"id": job_id, "delivery": delivery, "first_slot": TOTAL_SLOTS, "slots": CONNECTION_SLOTS},
            ).fetchone()
        except STATEMENT_ERRORS as exc:
            raise translate(exc, "completing a job in a transaction") from exc
        if not _single(row, "complete_in_transaction")[0]:
            raise DeliveryFenced(
                f"delivery {delivery} of job {job_id} is no longer current (taken back after its lease, "
                "handed to another delivery, or ended): its transaction rolls back"
            )

    def is_current(self, job_id: str, delivery: int) -> bool:
        """Whether ``delivery`` is still the job's current one (one primary-key read)."""
        current: bool = _single(self._read("is_current", {"id": job_id, "delivery": delivery}, "one"), "is_current")[0]
        return current

    def retry(self, job_id: str, delivery: int, message: str, delay: float, error: str | None) -> None:
        """The delivery failed and the job runs again after ``delay`` s, with its new message."""
        self._execute(
            "retry",
            {
                "id": job_id,
                "delivery": delivery,
                "delay": delay,
                "message": json.dumps(storable_json(json.loads(message))),
                "error": storable(error),
                "channel": CHANNEL,
            },
            fast=True,
        )

    def park(self, job_id: str, delivery: int, message: str, delay: float, error: str | None, event: str) -> None:
        """The delivery parks its job awaiting ``event`` for ``delay`` s (or resolves it from a kept signal)."""
        params = {
            "id": job_id,
            "delivery": delivery,
            "delay": delay,
            "message": json.dumps(storable_json(json.loads(message))),
            "error": storable(error),
            "event": event,
            "channel": CHANNEL,
        }
        self._under_event_lock("park", params)

    def signal(self, event: str, resolution: str, ttl: float) -> int:
        """Resume the jobs awaiting ``event``, keep the signal ``ttl`` s; how many resumed."""
        params = {"event": event, "resolution": resolution, "ttl": ttl, "channel": CHANNEL}
        row = self._under_event_lock("signal", params)
        resumed: int = _single(row, "signal")[0]
        return resumed

    def resolve_wait(self, job_id: str, event: str, timed_out: bool) -> str | None:
        """The job's resolution of its wait for ``event``, recorded now if it can be; else None."""
        row = self._execute("resolve_wait", {"id": job_id, "event": event, "timed_out": timed_out}, fetch="one")
        return None if row is None else str(row[0])

    def _under_event_lock(self, name: str, params: dict[str, Any]) -> Row | None:
        """``name`` in one transaction after the event's advisory lock (a park and a signal serialise)."""
        try:
            with self._conn() as conn, conn.transaction():
                conn.execute(QUERIES["event_lock"], params)
                return conn.execute(QUERIES[name], params).fetchone()
        except STATEMENT_ERRORS as exc:
            if isinstance(exc, UNAVAILABLE):
                self.trouble()
            raise translate(exc, name) from exc

    def fail_malformed(self, job_id: str, delivery: int, error: str) -> bool:
        """Fail a claimed row whose message does not decode; True when this call claimed its final failure."""
        row = self._execute(
            "fail_malformed",
            {"id": job_id, "delivery": delivery, "error": storable(error), "slot": self.slot()},
            fetch="one",
        )
        return bool(row and row[0])

    def claim_final_failure(self, job_id: str, delivery: int, error: str) -> bool:
        """True for the current delivery only: it runs the final-failure hooks (see jobs.sql).

        Written synchronously; the row stays held until the nack after the
        hooks fails it, so a crash in the hooks leaves them to run again.
        """
        params = {"id": job_id, "delivery": delivery, "error": storable(error), "slot": self.slot()}
        try:
            return self._execute("claim_final_failure", params, fetch="one") is not None
        except DatabaseRefused as exc:  # the error text, most likely: the failure matters more than its text
            params["error"] = f"(the error text could not be stored: {type(exc.__cause__ or exc).__name__})"
            return self._execute("claim_final_failure", params, fetch="one") is not None

    # -- workers, recovery, pruning -------------------------------------------------

    def prover_session(self, conn: psycopg.Connection[Any]) -> None:
        if self.pooled:
            return  # no session settings through a pooler: the server's synchronous_commit (on) holds
        try:
            conn.execute(QUERIES["prover_session"])
        except STATEMENT_ERRORS as exc:
            raise translate(exc, "prover session") from exc

    @staticmethod
    def prove(conn: psycopg.Connection[Any]) -> None:
        """One synchronous commit on the prover's connection: every claim committed before it is on disk."""
        try:
            conn.execute(QUERIES["prove"])
        except STATEMENT_ERRORS as exc:
            raise translate(exc, "proving claims") from exc

    def listen(self, conn: psycopg.Connection[Any]) -> None:
        if not self.listens:
            return  # through a transaction-mode pooler: the consumers poll (pg_poll_seconds)
        try:
            conn.execute(QUERIES["listen"])
        except STATEMENT_ERRORS as exc:
            raise translate(exc, "listen") from exc

    @staticmethod
    def notifications(conn: psycopg.Connection, timeout: float) -> Iterator[str]:
        """The queues named by the notifications that arrive within ``timeout`` s, each as it arrives."""
        try:
            for notify in conn.notifies(timeout=timeout):
                yield notify.payload
        except STATEMENT_ERRORS as exc:
            raise translate(exc, "waiting for notifications") from exc

    def heartbeat(self, conn: psycopg.Connection, hostname: str, pid: int, queues: list[str]) -> None:
        try:
            conn.execute(
                QUERIES["heartbeat"], {"id": self.worker_id, "hostname": hostname, "pid": pid, "queues": queues}
            )
        except STATEMENT_ERRORS as exc:
            raise translate(exc, "heartbeat") from exc

    def forget_worker(self) -> None:
        self._execute("forget_worker", {"id": self.worker_id})

    def recover(
        self, lease: float, limit: int, now: datetime | None = None, *, clock: tuple[float, float] | None = None
    ) -> list[Row]:
        """Take back up to ``limit`` rows of workers dead for a lease (server clock, or ``now``); returns
        the moved rows. ``clock``: (UNIX s, tolerance s): take nothing unless the statement's clock is
        within the tolerance of that reading (the one recovery's step check made)."""
        checked, within = clock if clock is not None else (None, None)
        params = {"lease": lease, "limit": limit, "now": now, "checked": checked, "within": within}
        return self._execute("recover", params, fetch="all")

    def server_clock(self, slack: float, now: datetime | None = None) -> tuple[float, int]:
        """The server's clock (UNIX s), and how many heartbeats ahead of it by over ``slack`` s were brought back."""
        epoch, clamped = _single(self._execute("server_clock", {"slack": slack, "now": now}, fetch="one"), "clock")
        return epoch, clamped

    def rearm_recovery(self, lease: float, now: datetime | None = None) -> None:
        """Nobody is declared dead for ``lease`` s from now (the server's clock was stepped)."""
        self._execute("rearm_recovery", {"lease": lease, "now": now})

    def release_orphans(self, lease: float, owned: set[str]) -> list[tuple[str, str]]:
        """This worker's rows claimed over a lease ago that it no longer knows about: back to pending."""
        return self._execute(
            "release_orphans", {"worker": self.worker_id, "lease": lease, "held": sorted(owned)}, fetch="all"
        )

    def forget_dead_workers(self, after: float) -> None:
        self._execute("forget_dead_workers", {"after": after})

    def prune(self, retention: float, limit: int) -> int:
        """Delete up to ``limit`` jobs finished more than ``retention`` s ago, with their steps; returns how many."""
        pruned: int = _single(self._execute("prune", {"retention": retention, "limit": limit}, fetch="one"), "prune")[0]
        return pruned

    def prune_orphan_steps(self, retention: float, limit: int) -> int:
        """Delete up to ``limit`` once-guarded steps older than ``retention`` s whose job is gone."""
        return self._execute("prune_orphan_steps", {"retention": retention, "limit": limit})

    def prune_groups(self, idle: float, limit: int) -> int:
        """Delete up to ``limit`` named groups not served for ``idle`` s that have no job to run or
        running (a tenant's rotation row; it is made again by its next enqueue). Two statements in
        one transaction, lock then re-check (lock_idle_groups, prune_groups in jobs.sql): race-free
        against an enqueue into the same group. Returns how many."""
        try:
            with self._conn() as conn, conn.transaction():
                idle_groups = conn.execute(QUERIES["lock_idle_groups"], {"idle": idle, "limit": limit}).fetchall()
                if not idle_groups:
                    return 0
                params = {"queues": [r[0] for r in idle_groups], "groups": [r[1] for r in idle_groups]}
                return conn.execute(QUERIES["prune_groups"], params).rowcount
        except STATEMENT_ERRORS as exc:
            if isinstance(exc, UNAVAILABLE):
                self.trouble()
            raise translate(exc, "prune groups") from exc

    # -- reads and operator actions ---------------------------------------------------

    def counts(self, queue: str) -> QueueCounts:
        row = _single(self._read("counts", {"queue": queue}, "one"), "counts")
        (
            waiting,
            delayed,
            active,
            running,
            failed,
            cancelled,
            completed_total,
            failed_total,
            paused,
            oldest,
            awaiting,
        ) = row
        return QueueCounts(
            queue,
            waiting,
            delayed,
            active,
            failed,
            int(completed_total),
            int(failed_total),
            paused,
            oldest,
            running,
            cancelled,
            awaiting=awaiting,
        )

    def group_counts(self, queue: str, limit: int) -> QueueGroups:
        rows = self._read("group_counts", {"queue": queue, "limit": max(1, limit)}, "all")
        groups = [GroupCounts(g, waiting, active, oldest) for g, waiting, active, oldest, _ in rows]
        total = int(rows[0][4]) if rows else 0  # every row carries the count of them all
        return QueueGroups(queue, groups[: max(0, limit)], total)

    def get(self, job_id: str) -> JobRecord | None:
        row = self._read("get_job", {"id": job_id}, "one")
        return job_record(row) if row else None

    def list(self, queue: str, state: str, limit: int, offset: int) -> list[JobRecord]:
        name, status = LISTS[state]
        rows = self._read(name, {"queue": queue, "status": status, "limit": limit, "offset": offset}, "all")
        return [job_record(row) for row in rows]

    def unfinished(self, queue: str) -> int:
        count: int = _single(self._read("unfinished", {"queue": queue}, "one"), "unfinished")[0]
        return count

    def flush(self, queue: str) -> None:
        self._execute("flush", {"queue": queue})

    def pause(self, queue: str) -> None:
        self._read("pause", {"queue": queue}, "none")

    def resume(self, queue: str) -> None:
        self._read("resume", {"queue": queue, "channel": CHANNEL}, "none")

    def set_group_weight(self, queue: str, group: str, weight: int) -> None:
        """Store a named group's weight (its row made if need be; the queue turns grouped)."""
        self._read("set_group_weight", {"queue": queue, "group": group, "weight": weight}, "none")

    def group_weights(self, queue: str) -> dict[str, int]:
        """The weights stored for the queue's named groups, those other than 1."""
        return {g: w for g, w in self._read("group_weights", {"queue": queue}, "all")}

    # Not repeated after a broken connection (unlike _read): a repeat of one that committed would
    # report "nothing retried" / "not found" for what it just did. The caller sees DatabaseUnavailable.

    def retry_failed(self, job_id: str | None, queue: str | None) -> int:
        row = self._execute("retry_failed", {"id": job_id, "queue": queue, "channel": CHANNEL}, fetch="one")
        retried: int = _single(row, "retry_failed")[0]
        return retried

    def promote(self, job_id: str) -> bool:
        row = self._execute("promote_job", {"id": job_id, "channel": CHANNEL}, fetch="one")
        promoted: int = _single(row, "promote_job")[0]
        return promoted > 0

    def cancel(self, job_id: str) -> str | None:
        """Cancel a job (jobs.sql, cancel_job); the status it had, None when unknown."""
        row = self._execute("cancel_job", {"id": job_id, "channel": CANCEL_CHANNEL}, fetch="one")
        return str(row[0]) if row else None

    def cancel_outcome(self, job_id: str, delivery: int, error: str | None) -> bool:
        """End a held job cancelled while ``delivery`` is current (jobs.sql, cancel_outcome)."""
        params = {"id": job_id, "delivery": delivery, "error": storable(error)}
        return self._execute("cancel_outcome", params, fetch="one") is not None

    def cancel_requested(self, job_ids: Sequence[str]) -> set[str]:
        rows = self._read("cancel_requested", {"ids": list(job_ids)}, "all")
        return {str(r[0]) for r in rows}

    def listen_cancel(self, conn: psycopg.Connection[Any]) -> None:
        try:
            conn.execute(QUERIES["listen_cancel"])
        except STATEMENT_ERRORS as exc:
            raise translate(exc, "listen") from exc

    def delete(self, job_id: str) -> bool:
        # A worker that claimed the job holds it (in_progress): only unheld jobs go.
        return self._execute("delete_job", {"id": job_id}, fetch="one") is not None


def _single(row: Row | None, name: str) -> Row:
    """The row of a query that always returns exactly one (an aggregate: a count, a min)."""
    assert row is not None, f"{name} returns one row"
    return row


def _enqueue_error(exc: BaseException) -> Exception:
    cause = translate(exc, "the enqueue")
    return BrokerUnavailable(f"{cause}; nothing was enqueued")


def _enqueue_params(rows: list[NewJob], dedup_ttl: float) -> dict[str, Any]:
    return {
        "ids": [r["id"] for r in rows],
        "queues": [r["queue"] for r in rows],
        "jobs": [r["job"] for r in rows],
        "priorities": [r["priority"] for r in rows],
        "rank_leads": [r["rank_lead"] for r in rows],
        "max_attempts": [r["max_attempts"] for r in rows],
        "keys": [r["key"] for r in rows],
        "messages": [r["message"] for r in rows],
        "errors": [storable(r["error"]) for r in rows],
        "delays": [r["delay"] for r in rows],
        "groups": [r["group"] for r in rows],
        "dedup_ttl": float(dedup_ttl),
        "channel": CHANNEL,
    }


def _worker_session(conn: psycopg.Connection[Any]) -> None:
    conn.execute(QUERIES["worker_session"])


def _durable_session(conn: psycopg.Connection[Any]) -> None:
    # Enqueues, synchronous claims, final failures and recovery wait for the
    # flush whatever the server's or the role's default says.
    conn.execute(QUERIES["prover_session"])

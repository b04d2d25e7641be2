"""Who works and what each attempt did: the worker registry and attempt history, on the broker's server.

The brokers know which jobs a dead worker held; operators also want to see
the workers themselves (host, pid, queues, heartbeat, what they run) and,
for a failed job, every attempt with its traceback. Those facts are written
by the worker processes (:class:`~conveyor.middleware.fleet.Fleet`)
into a store beside the broker's own data — Redis keys under the broker's
namespace, Postgres tables of their own, memory for the inline broker — so
the broker modules' core logic does not change, and any process (the API,
``conveyor workers``) reads them.

Every time is the store server's clock: a worker host whose clock lies
neither hides a late heartbeat nor dates an attempt wrongly.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.app import App

#: How long a worker's entry is kept after its last heartbeat (s).
FORGET_AFTER = 24 * 3600.0

#: Largest traceback kept per attempt (characters; the tail is kept: it names the raise).
TRACEBACK_LIMIT = 16000


@dataclass
class WorkerInfo:
    """One worker process as the registry holds it. Times are UNIX seconds of the store's clock."""

    id: str
    host: str
    pid: int
    queues: list[str]
    threads: int
    version: str
    started_at: float | None
    heartbeat_at: float | None
    in_flight: list[str] = field(default_factory=list)
    done: int = 0
    failed: int = 0
    #: When it left: stopped cleanly, or found dead (its jobs recovered). None while it runs.
    gone_at: float | None = None
    #: "stopped" (clean shutdown) or "recovered" (stopped heartbeating; its jobs went back).
    gone_reason: str | None = None


@dataclass
class AttemptInfo:
    """One attempt of a job: when and where it started, how it ended."""

    attempt: int
    worker: str
    started_at: float | None
    ended_at: float | None = None
    #: "completed", "failed", "deferred" (RetryLater), "skipped"; None while running or if the worker died.
    outcome: str | None = None
    error: str | None = None
    traceback: str | None = None


@dataclass(frozen=True)
class AttemptEvent:
    """A start or an end of an attempt, as the worker buffers it before writing.

    ``age`` is how long before the write it happened (s, from the worker's
    monotonic clock): the store dates it ``server_now - age``.
    """

    kind: str  # "start" | "end" | "full" (a start and its end in one write)
    job_id: str
    token: str
    attempt: int
    worker: str
    #: Seconds before the write that it happened: the start's for "start", the end's for "end" and "full".
    age: float = 0.0
    outcome: str | None = None
    error: str | None = None
    traceback: str | None = None
    #: "full" only: seconds before the write that the attempt started.
    start_age: float | None = None


class FleetStore:
    """Where the registry and the attempt history live; one implementation per broker."""

    def beat(self, info: WorkerInfo, *, keep: float) -> None:
        """Register or refresh a worker (heartbeat = the server's now); clears an earlier gone mark."""
        raise NotImplementedError

    def leave(self, info: WorkerInfo, reason: str) -> None:
        """Mark a worker gone now, with its last counts."""
        raise NotImplementedError

    def sweep(self, gone_after: float) -> int:
        """Mark gone ("recovered") every worker silent for ``gone_after`` s; forget old ones. Returns how many."""
        raise NotImplementedError

    def workers(self) -> tuple[float, list[WorkerInfo]]:
        """(the server's now, every known worker)."""
        raise NotImplementedError

    def write_attempts(self, events: list[AttemptEvent], *, keep: float) -> None:
        """Write buffered starts and ends, in order."""
        raise NotImplementedError

    def attempts(self, job_id: str) -> list[AttemptInfo]:
        """A job's attempts, oldest first."""
        raise NotImplementedError

    def count_enqueued(self, counts: dict[tuple[str, str], int]) -> None:
        """Add to the fleet's enqueue totals by (queue, job); a no-op where the broker counts them itself."""
        raise NotImplementedError

    def enqueued_totals(self) -> dict[tuple[str, str], int]:
        """The fleet's enqueue totals by (queue, job), since the broker's data began."""
        raise NotImplementedError

    def find_by_key(self, key: str) -> list[str]:
        """Ids of the jobs whose enqueue key is ``key`` (a key is held by one job while its TTL runs)."""
        raise NotImplementedError


def recovery_after(app: "App") -> float | None:
    """Seconds of silence after which the broker recovers a worker's jobs (None: inline, nothing to recover)."""
    name = app.settings.broker_name
    if name == "redis":
        return app.settings.heartbeat_timeout
    if name == "postgres":
        return app.settings.pg_lease_seconds
    return None


def beat_interval(app: "App") -> float:
    """How often a worker refreshes its entry: a sixth of the recovery time, within 0.1-10 s."""
    after = recovery_after(app)
    return 2.0 if after is None else min(10.0, max(0.1, after / 6))


def late_after(app: "App") -> float:
    """A heartbeat older than this is late: two and a half missed beats."""
    return 2.5 * beat_interval(app)


_stores: "weakref.WeakKeyDictionary[Any, FleetStore]" = weakref.WeakKeyDictionary()


def fleet_store(app: "App") -> FleetStore:
    """The store of ``app``'s broker (one per broker object)."""
    broker = app.broker
    store = _stores.get(broker)
    if store is None:
        name = app.settings.broker_name
        if name == "redis":
            from conveyor.brokers.fleet.redis_store import RedisFleetStore
            from conveyor.brokers.redis import RedisBroker

            assert isinstance(broker, RedisBroker)  # the App builds it from the same setting
            store = RedisFleetStore(broker.client, broker.namespace)
        elif name == "postgres":
            from conveyor.brokers.fleet.postgres_store import PostgresFleetStore

            store = PostgresFleetStore(app)
        else:
            from conveyor.brokers.fleet.memory_store import MemoryFleetStore
            from conveyor.brokers.inline import InlineBroker

            assert isinstance(broker, InlineBroker)  # the App builds it from the same setting
            store = MemoryFleetStore(broker)
        _stores[broker] = store
    return store

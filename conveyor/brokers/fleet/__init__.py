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
from typing import TYPE_CHECKING, Any

from conveyor.brokers.fleet.base import (
    FORGET_AFTER,
    TRACEBACK_LIMIT,
    AttemptEvent,
    AttemptInfo,
    FleetStore,
    WorkerInfo,
)

if TYPE_CHECKING:
    from conveyor.app import App


__all__ = [
    "FORGET_AFTER",
    "TRACEBACK_LIMIT",
    "WorkerInfo",
    "AttemptInfo",
    "AttemptEvent",
    "FleetStore",
    "beat_interval",
    "fleet_store",
    "late_after",
    "mark_process_gone",
    "recovery_after",
    "store_without_broker",
]


def recovery_after(app: "App") -> float | None:
    """Seconds of silence after which the broker recovers a worker's jobs (None: no recovery, inline)."""
    return app.settings.worker_lease if app.capabilities.recovery else None


def beat_interval(app: "App") -> float:
    """How often a worker refreshes its entry: a sixth of the recovery time, within 0.1-10 s."""
    after = recovery_after(app)
    return 2.0 if after is None else min(10.0, max(0.1, after / 6))


def late_after(app: "App") -> float:
    """A heartbeat older than this is late: two and a half missed beats."""
    return 2.5 * beat_interval(app)


_stores: "weakref.WeakKeyDictionary[Any, FleetStore]" = weakref.WeakKeyDictionary()


def fleet_store(app: "App") -> FleetStore:
    """The store of ``app``'s broker (one per broker object), built by the broker beside its data."""
    broker = app.broker
    store = _stores.get(broker)
    if store is None:
        store = _stores[broker] = broker.fleet_store(app)
    return store


#: ``gone_reason`` of a worker whose supervisor saw it die (SIGKILL, a crash): its jobs come back by lease recovery.
DIED = "died"


def store_without_broker(app: "App") -> FleetStore | None:
    """The registry's store for a process that runs no broker of its own (the supervisor); None on inline.

    Built from the settings, as the worker processes' brokers reach the same data: the Redis
    namespace, or the App's Postgres pool. Building ``app.broker`` would declare every actor and
    start conveyor's middleware in a process that runs no job.
    """
    return app.backend.broker_class.fleet_store_without_broker(app.settings, app)


def mark_process_gone(store: FleetStore, host: str, pid: int, reason: str = DIED) -> list[str]:
    """Mark gone now every live entry of process ``pid`` on ``host``; the ids marked.

    Only for a process known to be dead (its parent reaped it): the entry says nothing about its
    jobs, which the broker hands back when their lease runs out, fenced as ever (a dead process
    cannot ack). An entry already gone keeps its reason.
    """
    _, infos = store.workers()
    marked = []
    for info in infos:
        if info.host == host and info.pid == pid and info.gone_at is None:
            store.leave(info, reason)
            marked.append(info.id)
    return marked

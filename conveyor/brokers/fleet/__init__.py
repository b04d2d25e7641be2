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
    "recovery_after",
]


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
            store = RedisFleetStore(broker.client, broker.keys.shared, dedup_keys=broker.dedup_keys)
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

"""The dashboard's history: a per-minute rollup per queue and job type, on the broker's server.

Enqueued, completed, failed for good and retried jobs, wait and run times
(as log-scale bucket counts, see :mod:`~conveyor.brokers.rollup.base`) and
queue depth, for the last day. Counted in memory by each process
(:class:`~conveyor.middleware.rollup.Rollup`) and added in one batched,
idempotent write every ``CONVEYOR_ROLLUP_FLUSH_SECONDS``, into a store
beside the broker's data — Redis hashes with a TTL, a Postgres table,
memory for the inline broker — like the fleet's
(:mod:`conveyor.brokers.fleet`). Minutes are the store server's clock.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from conveyor.brokers.rollup.base import (
    BUCKETS,
    KEEP_SECONDS,
    MinuteRow,
    RollupStore,
    Tally,
    TallyGroup,
    bucket_of,
    percentile,
)

if TYPE_CHECKING:
    from conveyor.app import App

__all__ = [
    "BUCKETS",
    "KEEP_SECONDS",
    "MinuteRow",
    "RollupStore",
    "Tally",
    "TallyGroup",
    "bucket_of",
    "percentile",
    "rollup_store",
]

_stores: "weakref.WeakKeyDictionary[Any, RollupStore]" = weakref.WeakKeyDictionary()


def rollup_store(app: "App") -> RollupStore:
    """The rollup store of ``app``'s broker (one per broker object), built by the broker beside its data."""
    broker = app.broker
    store = _stores.get(broker)
    if store is None:
        store = _stores[broker] = broker.rollup_store(app)
    return store

"""Stores of the cron schedules managed at run time, beside the broker's data (like conveyor/results/).

A Postgres table for the postgres broker, one Redis hash for the redis broker, this process's
memory for the inline broker: picked by the broker's declared store, never by its name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor.appcache import per_app
from conveyor.scheduling.store.base import ScheduleStore, StoredSchedule

__all__ = ["ScheduleStore", "StoredSchedule", "schedule_store"]

if TYPE_CHECKING:
    from conveyor.app import App


@per_app
def schedule_store(app: App) -> ScheduleStore:
    """The App's store of managed schedules, beside its broker's data."""
    store = app.capabilities.store
    if store == "redis":
        from conveyor.brokers.redis.keys import shared_namespace
        from conveyor.redis_client import client, is_cluster
        from conveyor.scheduling.store.redis import RedisSchedules

        assert app.settings.redis_url  # the redis backend is chosen by it
        redis_client = client(app.settings.redis_url, app.settings)
        namespace = shared_namespace(app.settings.redis_namespace, cluster=is_cluster(redis_client))
        return RedisSchedules(redis_client, namespace)
    if store == "postgres":
        from conveyor.scheduling.store.postgres import PostgresSchedules

        return PostgresSchedules(app)
    from conveyor.scheduling.store.memory import MemorySchedules

    return MemorySchedules()

"""Fleet-wide concurrency over the broker's own store: a counting semaphore.

:class:`Semaphore` — at most N holders across every worker process on
every host (the llm queue's global concurrency). Rate limits (a provider's
requests per minute) are the library's budgets (``conveyor.budgets``).

It answers at once and never waits: a job that gets no slot
raises :class:`~conveyor.errors.RetryLater`, which re-runs it later
without spending an attempt. One module per store, picked by the broker:
Redis (``redis.py``), Postgres advisory locks and a counter table
(``postgres.py``), or this process alone for the inline broker
(``local.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor.appcache import per_app
from conveyor.errors import ConfigurationError
from conveyor.platform.limits.base import Limits, Semaphore, Slot  # noqa: F401  (the interface, importable from the package)
from conveyor.platform.settings import platform_settings

if TYPE_CHECKING:
    from conveyor.app import App


def build_limits(app: "App") -> Limits:
    """Limits on the store of ``app``'s broker."""
    settings = app.settings
    store = app.capabilities.store  # where the broker keeps its state (its capabilities)
    if store == "redis":
        from conveyor.platform.limits.redis import RedisLimits
        from conveyor.redis_client import client

        if not settings.redis_url:
            raise ConfigurationError("CONVEYOR_BROKER=redis needs REDIS_URL")
        return RedisLimits(
            client(settings.redis_url, settings),
            namespace=settings.redis_namespace,
            lease=platform_settings(app).llm_slot_lease,
        )
    if store == "postgres":
        from conveyor.platform.limits.postgres import PostgresSemaphore

        sessions = app.pool
        if settings.database_pooled:
            # The semaphore's slots are session advisory locks: a transaction-mode pooler would
            # hand them to whichever client runs next on that server connection.
            if not settings.listen_database_url:
                raise ConfigurationError(
                    "CONVEYOR_DATABASE_POOLED needs CONVEYOR_LISTEN_DATABASE_URL (a direct connection) for the "
                    "concurrency limits' advisory locks"
                )
            from conveyor.db import open_pool

            sessions = open_pool(settings.listen_database_url, max_size=8, name="conveyor-limits")
            return Limits(PostgresSemaphore(sessions), owned=sessions)
        return Limits(PostgresSemaphore(sessions))
    from conveyor.platform.limits.local import LocalSemaphore

    return Limits(LocalSemaphore())


limits_for = per_app(build_limits)
"""The app's limits, built once per App."""

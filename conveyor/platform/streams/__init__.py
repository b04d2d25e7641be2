"""Stream buffers: where a run's chunks wait for its readers (the SSE route).

One interface, one module per store, the store of the broker in use
(``conveyor.backends``), so a
deployment needs nothing more than it already runs:

* redis broker: a Redis Stream per run (``redis.py``);
* postgres broker (and the embedded default): the ``run_chunks`` table (``postgres.py``);
* inline broker: in this process's memory (``memory.py``).

Chunks are keyed by ``seq`` (1, 2, ...). Appending a seq the buffer already
holds changes nothing, so an attempt that re-runs after a crash and
regenerates the same chunks cannot duplicate one for the reader. ``end``
appends a final entry once, carrying the run's status.

A reader (the SSE route) follows a stream with ``async with
buffer.follow(run_id)``: it waits on a wake-up from the store (``XREAD
BLOCK``, ``LISTEN``, an in-process event), never on a timer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor.appcache import per_app
from conveyor.errors import ConfigurationError
from conveyor.platform.settings import platform_settings
from conveyor.platform.streams.base import READ_BATCH, Follower, StreamBuffer, StreamEntry  # noqa: F401  (the interface, importable from the package)

if TYPE_CHECKING:
    from conveyor.app import App


def build_buffer(app: "App") -> StreamBuffer:
    """A new buffer on the store that goes with ``app``'s broker."""
    settings = app.settings
    store = app.capabilities.store
    if store == "redis":
        from conveyor.platform.streams.redis import RedisStreamBuffer
        from conveyor.redis_client import async_reader, client

        if not settings.redis_url:
            raise ConfigurationError("CONVEYOR_BROKER=redis needs REDIS_URL")
        url = settings.redis_url
        return RedisStreamBuffer(
            client(url, settings),
            namespace=settings.redis_namespace,
            retention=platform_settings(app).stream_retention,
            reader=lambda: async_reader(url, settings),
            socket_timeout=settings.redis_socket_timeout,
        )
    if store == "postgres":
        from conveyor.platform.streams.postgres import PostgresStreamBuffer

        return PostgresStreamBuffer(app.pool, listen_url=settings.listen_database_url, pooled=settings.database_pooled)
    from conveyor.platform.streams.memory import MemoryStreamBuffer

    return MemoryStreamBuffer()


buffer_for = per_app(build_buffer)
"""The app's stream buffer, built once per App (the inline one must be shared by workers and readers)."""

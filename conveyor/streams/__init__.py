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
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..appcache import per_app

if TYPE_CHECKING:
    from ..app import App

#: Entries read per call.
READ_BATCH = 500


@dataclass(frozen=True)
class StreamEntry:
    """One entry of a run's stream: a chunk of text, or the end with the run's status in ``data``."""

    seq: int
    kind: Literal["chunk", "end"]
    data: str


class StreamBuffer(ABC):
    """A run's chunks by seq, readable from any seq, ended once."""

    @abstractmethod
    def append(self, run_id: str, seq: int, text: str) -> bool:
        """Add chunk ``seq`` (1-based) unless the buffer already holds it or has ended; True when added."""

    @abstractmethod
    def end(self, run_id: str, status: str) -> None:
        """Append the end entry (after the last chunk) unless there is one already."""

    @abstractmethod
    def read(self, run_id: str, after: int = 0, limit: int = READ_BATCH) -> list[StreamEntry]:
        """Entries with seq > ``after``, in order, at most ``limit``; no waiting."""

    def read_all(self, run_id: str) -> list[StreamEntry]:
        """Every entry of the run's stream."""
        entries: list[StreamEntry] = []
        while True:
            batch = self.read(run_id, entries[-1].seq if entries else 0)
            entries.extend(batch)
            if len(batch) < READ_BATCH:
                return entries

    def close(self) -> None:
        """Release connections; the default holds none of its own."""


def build_buffer(app: "App") -> StreamBuffer:
    """A new buffer on the store that goes with ``app``'s broker."""
    settings = app.settings
    store = app.backend.store
    if store == "redis":
        from .redis import RedisStreamBuffer

        return RedisStreamBuffer(settings.redis_url, namespace=settings.redis_namespace,
                                 retention=settings.stream_retention)
    if store == "postgres":
        from .postgres import PostgresStreamBuffer

        return PostgresStreamBuffer(app.pool)
    from .memory import MemoryStreamBuffer

    return MemoryStreamBuffer()


buffer_for = per_app(build_buffer)
"""The app's stream buffer, built once per App (the inline one must be shared by workers and readers)."""

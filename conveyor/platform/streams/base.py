"""The stream buffer interface: what every store's buffer does (see the package's docstring)."""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Literal

#: Entries read per call.
READ_BATCH = 500


@dataclass(frozen=True)
class StreamEntry:
    """One entry of a run's stream: a chunk of text, or the end with the run's status in ``data``."""

    seq: int
    kind: Literal["chunk", "end"]
    data: str


class Follower(ABC):
    """A reader of one run's stream that waits for a wake-up, not on a timer (:meth:`StreamBuffer.follow`)."""

    @abstractmethod
    async def entries(self, after: int, timeout: float) -> list[StreamEntry]:
        """Entries with seq > ``after``; when there are none yet, wait for one up to ``timeout`` seconds ([] then)."""


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

    @abstractmethod
    def follow(self, run_id: str) -> AbstractAsyncContextManager[Follower]:
        """``async with buffer.follow(run_id) as f:`` a :class:`Follower` of the run's stream (an SSE reader's)."""

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


class Wakeups:
    """Who waits on which run, in this process: :meth:`wake` (from any thread) sets their events.

    For the stores whose writers' news arrives in this process (the memory buffer's appends, the
    Postgres buffer's LISTEN connection). A wake-up only means "read again": a reader re-reads the
    store, so a spurious one costs a read and a lost one costs at most the reader's timeout.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}

    def wake(self, run_id: str) -> None:
        with self._lock:
            waiters = list(self._waiting.get(run_id, ()))
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that reader's loop has closed
                pass

    def wake_all(self) -> None:
        """Every reader reads again (after a wake-up may have been lost: a reconnected listener)."""
        with self._lock:
            runs = list(self._waiting)
        for run_id in runs:
            self.wake(run_id)

    @asynccontextmanager
    async def follower(self, buffer: StreamBuffer, run_id: str) -> AsyncIterator[Follower]:
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiting.setdefault(run_id, set()).add(waiter)
        try:
            yield _EventFollower(buffer, run_id, waiter[1])
        finally:
            with self._lock:
                left = self._waiting.get(run_id)
                if left is not None:
                    left.discard(waiter)
                    if not left:
                        del self._waiting[run_id]


class _EventFollower(Follower):
    def __init__(self, buffer: StreamBuffer, run_id: str, event: asyncio.Event) -> None:
        self._buffer, self._run_id, self._event = buffer, run_id, event

    async def entries(self, after: int, timeout: float) -> list[StreamEntry]:
        # Cleared before reading: news that lands after the read sets it again, and the wait returns at once.
        self._event.clear()
        found = await asyncio.to_thread(self._buffer.read, self._run_id, after)
        if found:
            return found
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            return []
        return await asyncio.to_thread(self._buffer.read, self._run_id, after)

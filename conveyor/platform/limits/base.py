"""The limits interface: a fleet-wide semaphore (see the package's docstring)."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Iterator


class Slot(ABC):
    """A held place in a semaphore; release it exactly once (``with`` does)."""

    @abstractmethod
    def release(self) -> None:
        """Give the place back."""

    def __enter__(self) -> "Slot":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class Semaphore(ABC):
    """At most ``limit`` holders of ``name`` at once, fleet-wide."""

    @abstractmethod
    def try_acquire(self, name: str, limit: int) -> Slot | None:
        """A slot if fewer than ``limit`` are held, else None. Never waits."""

    @contextmanager
    def held(self, name: str, limit: int) -> Iterator[Slot | None]:
        """``with sem.held(name, n) as slot:`` — ``slot`` is None when none was free."""
        slot = self.try_acquire(name, limit)
        try:
            yield slot
        finally:
            if slot is not None:
                slot.release()

    @asynccontextmanager
    async def held_async(self, name: str, limit: int) -> AsyncIterator[Slot | None]:
        """``held`` in a coroutine (an async job): the store's calls run in the loop's thread pool.

        A cancel (a time limit, a cancel's interrupt) that lands while the slot is
        being taken does not leak it: the acquire finishes in its thread and a slot
        it took is given back. The release runs in its thread to the end, even if
        the coroutine is cancelled again while it waits for it.
        """
        acquiring = asyncio.ensure_future(asyncio.to_thread(self.try_acquire, name, limit))
        try:
            slot = await asyncio.shield(acquiring)
        except asyncio.CancelledError:
            acquiring.add_done_callback(_give_back)
            raise
        try:
            yield slot
        finally:
            if slot is not None:
                await asyncio.to_thread(slot.release)


def _give_back(acquired: asyncio.Future[Slot | None]) -> None:
    """Release a slot whose taker was cancelled before it could use it (on the loop: the release in a thread)."""
    if acquired.cancelled() or acquired.exception() is not None:
        return
    slot = acquired.result()
    if slot is not None:
        acquired.get_loop().run_in_executor(None, slot.release)


class Limits:
    """The semaphore of one store."""

    def __init__(self, semaphore: Semaphore, *, owned: Any = None) -> None:
        """``owned``: a pool opened for these limits alone (closed with them)."""
        self.semaphore = semaphore
        self._owned = owned

    def close(self) -> None:
        """Release connections of their own (the Redis ones, a pool of direct sessions)."""
        if self._owned is not None:
            self._owned.close()

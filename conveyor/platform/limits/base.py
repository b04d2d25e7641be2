"""The limits interface: a fleet-wide semaphore (see the package's docstring)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import Any, Iterator


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

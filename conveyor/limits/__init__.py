"""Fleet-wide limits over the broker's own store: a counting semaphore and a request rate limit.

* :class:`Semaphore` — at most N holders across every worker process on
  every host (the llm queue's global concurrency).
* :class:`RateLimit` — at most N hits per fixed window (a provider's
  requests per minute).

Both answer at once and never wait: a job that gets no slot or no hit
raises :class:`~conveyor.errors.RetryLater`, which re-runs it later
without spending an attempt. One module per store, picked by the broker:
Redis (``redis.py``), Postgres advisory locks and a counter table
(``postgres.py``), or this process alone for the inline broker
(``local.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from ..appcache import per_app

if TYPE_CHECKING:
    from ..app import App


class Slot(ABC):
    """A held place in a semaphore; release it exactly once (``with`` does)."""

    @abstractmethod
    def release(self) -> None:
        """Give the place back."""

    def __enter__(self) -> "Slot":
        return self

    def __exit__(self, *exc_info) -> None:
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


class RateLimit(ABC):
    """At most ``limit`` hits of ``name`` per ``window`` seconds (fixed windows)."""

    @abstractmethod
    def hit(self, name: str, limit: int, window: float) -> float:
        """Count one hit; 0.0 if allowed, else the seconds until the window ends (the hit is refused)."""


class Limits:
    """The semaphore and rate limit of one store."""

    def __init__(self, semaphore: Semaphore, rate: RateLimit) -> None:
        self.semaphore = semaphore
        self.rate = rate

    def close(self) -> None:
        """Release connections of their own (the Redis ones)."""


def build_limits(app: "App") -> Limits:
    """Limits on the store of ``app``'s broker."""
    settings = app.settings
    store = app.backend.store  # the broker's store (conveyor.backends)
    if store == "redis":
        from .redis import RedisLimits

        return RedisLimits(settings.redis_url, namespace=settings.redis_namespace, lease=settings.llm_slot_lease)
    if store == "postgres":
        from .postgres import PostgresRateLimit, PostgresSemaphore

        return Limits(PostgresSemaphore(app.pool), PostgresRateLimit(app.pool))
    from .local import LocalRateLimit, LocalSemaphore

    return Limits(LocalSemaphore(), LocalRateLimit())


limits_for = per_app(build_limits)
"""The app's limits, built once per App."""

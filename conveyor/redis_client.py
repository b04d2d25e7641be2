"""Redis access shared by the Redis broker and every store beside it: the client, and the one redis error translation.

:func:`client` builds every Redis client conveyor opens from the settings
(timeouts, the idle connections' health check, reconnects with backoff), so
the stream buffer, the limits and the broker fail the same way when Redis
is away: within seconds, never hanging a worker.

redis-py's errors enter conveyor's error tree here (:func:`translate`,
:class:`wrap_errors`): :class:`~conveyor.errors.BrokerUnreachable` (a
:class:`~conveyor.errors.StoreUnavailable`) when Redis cannot be reached or
cannot serve now, :class:`~conveyor.errors.BrokerRejected` (a
:class:`~conveyor.errors.StoreRefused`) when it answered with an error.
The broker's enqueue, fetch and outcome paths decide with
:func:`is_unavailable` themselves, because they raise errors of their own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from conveyor.errors import BrokerRejected, BrokerUnreachable

if TYPE_CHECKING:
    from conveyor.settings import Settings

#: Errors that mean "Redis cannot be reached or did not answer in time" (a BUSY reply too: see is_unavailable).
UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, TimeoutError, ConnectionError)

_Method = TypeVar("_Method", bound=Callable[..., Any])


def client(url: str, settings: Settings) -> redis.Redis:
    """A Redis client on ``url`` with the settings' timeouts, health check and retries.

    Built here rather than with ``redis.Redis.from_url(url)`` alone, which
    would wait for a dead server's reply forever.
    """
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=settings.redis_connect_timeout,
        socket_timeout=settings.redis_socket_timeout,
        health_check_interval=int(settings.redis_health_check_interval),
        retry=Retry(ExponentialWithJitterBackoff(base=0.1, cap=2.0), settings.redis_retries),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )


def is_unavailable(exc: BaseException) -> bool:
    """True for a connection error, a timeout, or a reply saying Redis cannot serve now (a long script, loading)."""
    if isinstance(exc, UNAVAILABLE):
        return True
    # OOM: a full Redis under noeviction refuses writes until memory frees; READONLY/NOREPLICAS: a failover.
    return isinstance(exc, redis.ResponseError) and str(exc).startswith(
        ("BUSY", "LOADING", "MASTERDOWN", "OOM", "READONLY", "NOREPLICAS")
    )


def translate(exc: BaseException, what: str) -> BrokerUnreachable | BrokerRejected:
    """The conveyor error for a redis error, saying what was being done (the first line of redis's text only)."""
    text = str(exc).strip()
    summary = f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"
    if is_unavailable(exc):
        return BrokerUnreachable(f"Redis is unavailable ({what}): {summary}")
    return BrokerRejected(f"Redis refused {what}: {summary}")


class wrap_errors(contextlib.ContextDecorator):
    """``with wrap_errors("reading a stream"):`` (or ``@wrap_errors(...)``): redis errors leave it translated."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> wrap_errors:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None and isinstance(exc, (redis.RedisError, *UNAVAILABLE)):
            raise translate(exc, self.what) from exc


def translated(method: _Method) -> _Method:
    """:class:`wrap_errors` named for the method it wraps (the broker's reads and operator actions)."""
    return wrap_errors(method.__name__)(method)

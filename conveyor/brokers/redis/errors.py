"""Where redis-py's errors enter: which mean "Redis is away", and the translation into conveyor's error tree."""

from __future__ import annotations

import functools
from typing import Callable, ParamSpec, TypeVar

import redis

from conveyor.errors import BrokerRejected, BrokerUnreachable

#: Errors that mean "Redis cannot be reached or did not answer in time" (a BUSY reply too: see is_unavailable).
UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, TimeoutError, ConnectionError)


def is_unavailable(exc: BaseException) -> bool:
    """True for a connection error, a timeout, or a reply saying Redis cannot serve now (a long script, loading)."""
    if isinstance(exc, UNAVAILABLE):
        return True
    # OOM: a full Redis under noeviction refuses writes until memory frees; READONLY/NOREPLICAS: a failover.
    return isinstance(exc, redis.ResponseError) and str(exc).startswith(
        ("BUSY", "LOADING", "MASTERDOWN", "OOM", "READONLY", "NOREPLICAS")
    )


P = ParamSpec("P")
R = TypeVar("R")


def translated(method: Callable[P, R]) -> Callable[P, R]:
    """Reads and operator actions: a redis error becomes conveyor's, ``raise X from exc``."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except redis.RedisError as exc:
            if is_unavailable(exc):
                raise BrokerUnreachable(f"Redis is unavailable: {type(exc).__name__}: {exc}") from exc
            raise BrokerRejected(f"Redis refused {method.__name__}: {type(exc).__name__}: {exc}") from exc

    return wrapper

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
import urllib.parse
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

import redis
import redis.asyncio
import redis.cluster
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from conveyor.errors import BrokerRejected, BrokerUnreachable, ConfigurationError

if TYPE_CHECKING:
    from conveyor.settings import Settings

#: Errors that mean "Redis cannot be reached or did not answer in time" (a BUSY reply too: see is_unavailable).
UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, TimeoutError, ConnectionError)

_Method = TypeVar("_Method", bound=Callable[..., Any])


def text(value: object) -> str:
    """A Redis reply as text: bytes decoded (UTF-8), anything else as ``str()`` gives it.

    conveyor's Redis clients keep ``decode_responses`` off, so keys, fields and
    ids come back as bytes; redis-py types them ``bytes | str`` (a decoding
    client's replies too), and a script's reply may hold numbers. This is the
    one place that turns a reply into ``str`` (here, below the broker, so the
    stores beside it use it without importing the broker's package).
    """
    return value.decode() if isinstance(value, bytes) else str(value)


#: The scheme of a primary found through Redis Sentinel: ``redis+sentinel://host:port,host:port/mymaster[/db]``.
SENTINEL_SCHEME = "redis+sentinel://"


class SentinelURL(NamedTuple):
    sentinels: list[tuple[str, int]]
    service: str
    db: int
    password: str | None


def parse_sentinel_url(url: str) -> SentinelURL:
    """``redis+sentinel://[:password@]host:port[,host:port…]/service[/db]``; a clear error for anything else."""
    rest = url[len(SENTINEL_SCHEME) :]
    hosts, _, path = rest.partition("/")
    password = None
    if "@" in hosts:
        auth, _, hosts = hosts.rpartition("@")
        password = urllib.parse.unquote(auth.partition(":")[2]) or None
    sentinels = []
    for part in filter(None, hosts.split(",")):
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigurationError("REDIS_URL: each sentinel must be host:port (redis+sentinel://h:p,h:p/service)")
        sentinels.append((host.strip("[]"), int(port)))
    service, _, db = path.partition("/")
    if not sentinels or not service or (db and not db.isdigit()):
        raise ConfigurationError("REDIS_URL: expected redis+sentinel://host:port[,host:port...]/service[/db]")
    return SentinelURL(sentinels, service, int(db or 0), password)


#: The scheme of a Redis Cluster: ``redis+cluster://[:password@]host:port[,host:port…]`` (any nodes of it).
CLUSTER_SCHEME = "redis+cluster://"


class ClusterURL(NamedTuple):
    nodes: list[tuple[str, int]]
    password: str | None


def parse_cluster_url(url: str) -> ClusterURL:
    """``redis+cluster://[:password@]host:port[,host:port…]``; a clear error (the URL not echoed) for anything else."""
    hosts = url[len(CLUSTER_SCHEME) :].rstrip("/")
    password = None
    if "@" in hosts:
        auth, _, hosts = hosts.rpartition("@")
        password = urllib.parse.unquote(auth.partition(":")[2]) or None
    nodes = []
    for part in filter(None, hosts.split(",")):
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit() or "/" in part:
            raise ConfigurationError("REDIS_URL: expected redis+cluster://host:port[,host:port...] (no database)")
        nodes.append((host.strip("[]"), int(port)))
    if not nodes:
        raise ConfigurationError("REDIS_URL: expected redis+cluster://host:port[,host:port...] (no database)")
    return ClusterURL(nodes, password)


def is_cluster(client: object) -> bool:
    """True for a Redis Cluster client (see :func:`cluster_client`)."""
    return isinstance(client, redis.cluster.RedisCluster)


def cluster_client(url: str, settings: Settings) -> redis.Redis:
    """A ``redis.cluster.RedisCluster`` on any nodes of the cluster, with the settings' timeouts and retries.

    Typed as ``redis.Redis``: it answers the same commands, each routed to the node owning its key's slot
    (a script call to the slot of its first key); what differs is checked with :func:`is_cluster`.
    """
    found = parse_cluster_url(url)
    options = _options(settings)
    options.pop("retry_on_error")  # the cluster client retries connection errors itself, after a topology refresh
    cluster = redis.cluster.RedisCluster(
        startup_nodes=[
            redis.cluster.ClusterNode(host, port)  # type: ignore[no-untyped-call,unused-ignore]
            for host, port in found.nodes
        ],
        password=found.password,
        **options,
    )
    return cast("redis.Redis", cluster)


def _options(settings: Settings) -> dict[str, Any]:
    return {
        "socket_connect_timeout": settings.redis_connect_timeout,
        "socket_timeout": settings.redis_socket_timeout,
        "health_check_interval": int(settings.redis_health_check_interval),
        "retry": Retry(ExponentialWithJitterBackoff(base=0.1, cap=2.0), settings.redis_retries),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
    }


def client(url: str, settings: Settings) -> redis.Redis:
    """A Redis client on ``url`` with the settings' timeouts, health check and retries.

    Built here rather than with ``redis.Redis.from_url(url)`` alone, which
    would wait for a dead server's reply forever. A ``redis+sentinel://`` URL
    gives a client of the service's current primary: after a failover its
    connections find the new primary through the sentinels (a connection to a
    demoted primary is dropped at its first READONLY reply, and the call retried).
    """
    if url.startswith(CLUSTER_SCHEME):
        return cluster_client(url, settings)
    if url.startswith(SENTINEL_SCHEME):
        found = parse_sentinel_url(url)
        sentinel = redis.Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
            found.sentinels,
            sentinel_kwargs={
                "socket_connect_timeout": settings.redis_connect_timeout,
                "socket_timeout": settings.redis_socket_timeout,
            },
            **_options(settings),
        )
        primary: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call,unused-ignore]
            found.service, db=found.db, password=found.password
        )
        return primary
    return redis.Redis.from_url(url, **_options(settings))


def async_reader(url: str, settings: Settings) -> redis.asyncio.Redis:
    """An asyncio client of one connection on ``url`` (a stream's reader), Sentinel URLs included."""
    options: dict[str, Any] = {
        "socket_connect_timeout": settings.redis_connect_timeout,
        "socket_timeout": settings.redis_socket_timeout,
    }
    if url.startswith(CLUSTER_SCHEME):
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        nodes = parse_cluster_url(url)
        # XREAD BLOCK on one key goes to the node owning its slot, on a connection of its own.
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in nodes.nodes],
            password=nodes.password,
            **options,
        )
        return cast("redis.asyncio.Redis", cluster)
    if url.startswith(SENTINEL_SCHEME):
        from redis.asyncio.sentinel import Sentinel

        found = parse_sentinel_url(url)
        sentinel = Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
            found.sentinels, sentinel_kwargs=options, **options
        )
        reader: redis.asyncio.Redis = sentinel.master_for(
            found.service, db=found.db, password=found.password, single_connection_client=True
        )
        return reader
    return redis.asyncio.Redis.from_url(url, single_connection_client=True, **options)


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

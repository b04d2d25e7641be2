"""Redis Cluster plumbing of the broker: an enqueue's script call sent once, on the node owning its slot.

``call_once`` (sending.py) writes a call on one connection it holds, so that a
lost reply is never silently repeated; on a cluster that connection is one of
the node owning the scope's slot. A redirect reply (MOVED, ASK), TRYAGAIN or
CLUSTERDOWN ran nothing: it is :class:`NotSent`, after the cluster client has
read the topology again, so the enqueue's next attempt goes to the new owner.
"""

from __future__ import annotations

from typing import Any

import redis

from conveyor.brokers.redis.sending import NotSent
from conveyor.redis_client import UNAVAILABLE

#: Cluster replies that ran nothing: the slot is elsewhere (MOVED, ASK), moving (TRYAGAIN) or unserved.
REDIRECTS = (
    redis.exceptions.AskError,  # MovedError is one
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
)


def node_client(cluster: Any, key: str) -> NodeClient:
    """The client of the node owning ``key``'s slot, for ``call_once``; NotSent when none can be found."""
    try:
        node = cluster.get_node_from_key(key)
        found: redis.Redis = cluster.get_redis_connection(node)
    except (redis.RedisError, *UNAVAILABLE) as exc:
        raise NotSent(exc) from exc
    return NodeClient(found, cluster)


def on_node(cluster: Any, key: str) -> redis.Redis:
    """The plain client of the node owning ``key``'s slot: a pipeline on it keeps a keyless command (WAIT)
    on the connection that ran the script. A node that cannot be found is a connection error (nothing ran)."""
    try:
        return node_client(cluster, key).node
    except NotSent as exc:
        cause = exc.cause
        raise cause if isinstance(cause, redis.ConnectionError) else redis.ConnectionError(str(exc)) from exc


def refresh(cluster: Any) -> None:
    """Read the topology again (after a call to a node failed: a failover may have moved its slots)."""
    try:
        cluster.nodes_manager.initialize()
    except (redis.RedisError, *UNAVAILABLE):
        pass  # no node answers yet: the next attempt finds out again


class NodeClient:
    """One node's client as ``call_once`` uses it, whose redirect replies are NotSent after a topology refresh."""

    def __init__(self, node: redis.Redis, cluster: Any) -> None:
        self._node = node
        self._cluster = cluster
        #: The node's own client (one node, no redirects followed).
        self.node = node
        self.connection_pool = node.connection_pool

    def parse_response(self, conn: Any, command: str) -> Any:
        try:
            return self._node.parse_response(conn, command)  # type: ignore[no-untyped-call]
        except REDIRECTS as exc:
            refresh(self._cluster)
            raise NotSent(exc) from exc

    def script_load(self, script: str) -> Any:
        return self._node.script_load(script)

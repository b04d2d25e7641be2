"""The systems under test, one module each, all with the shape of :class:`~bench.peers.base.Peer`."""

from __future__ import annotations

from .base import Peer, Producer
from .celery_peer import CeleryRedis
from .conveyor_peer import ConveyorPostgres, ConveyorRedis
from .dramatiq_peer import DramatiqPostgres, DramatiqRedis
from .procrastinate_peer import ProcrastinatePostgres

#: Every peer by name, in the order the report lists them.
PEERS: dict[str, Peer] = {
    peer.name: peer
    for peer in (
        ConveyorRedis(),
        DramatiqRedis(),
        CeleryRedis(),
        ConveyorPostgres(),
        DramatiqPostgres(),
        ProcrastinatePostgres(),
    )
}


def get_peer(name: str) -> Peer:
    """The peer called ``name`` (``conveyor-redis``, ``celery-redis``, ...)."""
    return PEERS[name]


__all__ = ["PEERS", "Peer", "Producer", "get_peer"]

"""What every system under test provides to the harness.

A peer is used on both sides of a process boundary: in the parent it
resets its state and enqueues (:meth:`Peer.setup`, :meth:`Peer.producer`);
in each worker process :meth:`Peer.serve` boots its worker, says it is
ready, waits for the go signal, then consumes until the process is killed.
Every peer's job body is :func:`bench.probe.hit`.
"""

from __future__ import annotations

import threading
from typing import Any


class Producer:
    """Parent-side enqueueing for one peer."""

    #: How :meth:`enqueue_bulk` enqueues, as the report shows it.
    bulk_method = "one call per job"

    def enqueue_bulk(self, payloads: list[dict]) -> None:
        """Enqueue every payload, by the fastest API the peer offers."""
        for payload in payloads:
            self.send(payload)

    def send(self, payload: dict) -> None:
        """Enqueue one job now."""
        raise NotImplementedError

    def close(self) -> None:
        """Release connections."""


class Peer:
    """One system under test on one backend."""

    #: Short identifier, used by ``--only`` and in the report.
    name = ""
    #: Human label for the report.
    label = ""
    #: "redis" or "postgres": the server it runs on.
    backend = ""
    #: The distributions whose versions the report lists.
    distributions: tuple[str, ...] = ()

    def unavailable(self) -> str | None:
        """Why this peer cannot run here, or None when it can."""
        return None

    def setup(self, servers: Any, tag: str) -> dict:
        """Give the peer clean state on ``servers``; return the environment its processes need (picklable)."""
        raise NotImplementedError

    def producer(self, env: dict) -> Producer:
        raise NotImplementedError

    def serve(self, env: dict, threads: int, ready: Any, go: Any) -> None:
        """In a worker process: boot, ``ready.set()``, ``go.wait()``, then consume forever."""
        raise NotImplementedError

    def describe(self) -> str:
        """How this peer is configured, one line for the report."""
        return ""


def block_forever() -> None:
    """Park the main thread of a worker process; the harness kills the process when done."""
    threading.Event().wait()

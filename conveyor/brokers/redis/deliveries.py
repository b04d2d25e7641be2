"""What one worker process holds on Redis: its fetched deliveries and the retries their acks will write.

The Postgres broker's twin is ``postgres/deliveries.py``. Both the broker
and its consumer read and change these through this object's public
methods, never through each other's private members, so the consumer
depends on the broker's contract only (issue 19).

A delivery is *held* from the fetch that handed it out until its outcome is
written (or it is handed back): the release pass never hands back a held
delivery, and the consumer's prefetch room counts them. A hold is per
(list, rid) and remembers its delivery number, so settling an old delivery
never unholds a newer one of the same message.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Iterable

from conveyor.logs import log_event


@dataclasses.dataclass(frozen=True)
class Retry:
    """A failed delivery's next run, written with its outcome in one script call (see ``RedisConsumer.ack``)."""

    rid: str
    data: bytes
    delay: int | str  # ms, "" for none
    error: str
    #: A park (ctx.wait_for): the event awaited, and the message as its queue takes it (no eta).
    event: str = ""
    resume: bytes = b""


class Deliveries:
    """Holds (list name -> rid -> delivery) and stashed retries ((job id, delivery) -> Retry), thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fetch_locks: dict[str, threading.Lock] = {}
        self._held: dict[str, dict[str, int]] = {}
        self._retries: dict[tuple[str, int], Retry] = {}

    def fetching(self, name: str) -> threading.Lock:
        """The critical section a fetch of ``name`` and the release pass share: a fetched delivery is held
        before the release pass can read the holds, so it is never handed back while in flight."""
        with self._lock:
            return self._fetch_locks.setdefault(name, threading.Lock())

    def hold(self, name: str, rid: str, delivery: int) -> None:
        """Called with ``fetching(name)`` held, for each row a fetch returned."""
        with self._lock:
            self._held.setdefault(name, {})[rid] = delivery

    def settle(self, name: str, pairs: Iterable[tuple[str | bytes, int | None]]) -> None:
        """(rid, delivery) pairs are no longer held here; a hold of a newer delivery of the same rid stays."""
        with self._lock:
            held = self._held.get(name)
            if held:
                for rid, delivery in pairs:
                    rid = rid.decode() if isinstance(rid, bytes) else rid
                    if delivery is None or held.get(rid) == int(delivery):
                        held.pop(rid, None)

    def count(self, name: str) -> int:
        """How many deliveries of list ``name`` this process holds."""
        with self._lock:
            return len(self._held.get(name, ()))

    def held(self, name: str) -> list[str]:
        """The rids of list ``name`` held here (read under ``fetching(name)`` by the release pass)."""
        with self._lock:
            return list(self._held.get(name, {}))

    def any_held(self) -> bool:
        with self._lock:
            return any(self._held.values())

    def stash_retry(self, job_id: str, delivery: int, retry: Retry) -> None:
        """The Retries middleware's retry of a running delivery, written later by that delivery's ack."""
        with self._lock:
            self._retries[(job_id, delivery)] = retry

    def take_retry(self, job_id: str, delivery: int) -> Retry | None:
        with self._lock:
            return self._retries.pop((job_id, delivery), None)

    def keep_retry(self, job_id: str, delivery: int, retry: Retry) -> None:
        """Put back a retry whose write did not reach Redis, so the ack's next try writes it (unless a newer
        stash for the same delivery is already there)."""
        with self._lock:
            self._retries.setdefault((job_id, delivery), retry)


def refused(what: str, queue: str, job_id: str, why: str = "the job was handed to another delivery") -> None:
    """Log an outcome the script refused: the delivery was superseded, so its write changed nothing."""
    log_event(
        "refused",
        level="warning",
        queue=queue,
        job=None,
        job_id=job_id,
        attempt=None,
        reason=f"{what} of a superseded delivery: {why}",
    )

"""Limits on Redis (redis broker).

The semaphore is a sorted set of holders scored by lease expiry; acquiring
drops expired holders first, so a worker that died holding a slot frees it
after ``CONVEYOR_LLM_SLOT_LEASE`` seconds. A live holder renews its lease
from a background thread. Time is Redis's own (``TIME``), so hosts with
skewed clocks agree.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import redis

from conveyor.logs import log_event
from conveyor.platform.limits.base import Limits, Semaphore, Slot
from conveyor.redis_client import wrap_errors

_SCRIPT = (Path(__file__).with_name("limits.lua")).read_text()


class _LeasedSlot(Slot):
    """A holder id in the set, renewed every third of the lease until released."""

    def __init__(self, semaphore: "RedisSemaphore", key: str, holder: str) -> None:
        self._semaphore, self._key, self._holder = semaphore, key, holder
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew, name="conveyor-slot-lease", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        sem = self._semaphore
        while not self._stop.wait(sem.lease_ms / 3000):
            try:
                kept = sem._call("renew", self._key, self._holder)
            except redis.RedisError:
                continue  # Redis away for a moment; the lease has slack for two misses
            if not kept:
                log_event(
                    "slot_lost",
                    level="warning",
                    queue=None,
                    job=None,
                    job_id=None,
                    attempt=None,
                    slot=self._key,
                    reason="lease expired before renewal",
                )
                return

    @wrap_errors("releasing a slot")
    def release(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._semaphore._call("release", self._key, self._holder)


class RedisSemaphore(Semaphore):
    """Leased slots in ``<namespace>:slots:<name>``."""

    def __init__(self, client: redis.Redis, namespace: str, lease: float) -> None:
        self.client, self.namespace, self.lease_ms = client, namespace, int(lease * 1000)
        self._script = client.register_script(_SCRIPT)

    def _call(self, command: str, key: str, *args: str | int) -> int:
        return int(self._script(keys=[key], args=[command, self.lease_ms, *args]))

    @wrap_errors("acquiring a slot")
    def try_acquire(self, name: str, limit: int) -> Slot | None:
        key = f"{self.namespace}:slots:{name}"
        holder = uuid.uuid4().hex
        if not self._call("acquire", key, holder, limit):
            return None
        return _LeasedSlot(self, key, holder)


class RedisLimits(Limits):
    """The semaphore on its own Redis client (``conveyor.redis_client.client``: the settings' timeouts)."""

    def __init__(self, client: redis.Redis, *, namespace: str, lease: float) -> None:
        self.client = client
        super().__init__(RedisSemaphore(self.client, namespace, lease))

    def close(self) -> None:
        self.client.close()

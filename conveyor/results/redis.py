"""Results in Redis: one stream per job (``<namespace>:result:<job id>``), woken by ``XREAD BLOCK``.

Each write appends an entry (a result, or a failure marker) and renews the key's TTL, in one
MULTI; readers take the first result in the stream, so a later run's value never replaces
the one a reader saw. A reader blocks on entries after the last it read, so a write between
its read and its wait still wakes it, and any number of readers wait on one job.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from conveyor.redis_client import wrap_errors
from conveyor.results.base import Entry, Watch

if TYPE_CHECKING:
    import redis

    from conveyor.settings import Settings

#: Entries a job's stream keeps: a result and the markers of the failures before it need a few.
MAX_ENTRIES = 16

#: A blocking read returns this long before the client's socket timeout would call it a failure.
BLOCK_MARGIN = 1.0


class RedisResults:
    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.client = client
        self.namespace = settings.redis_namespace
        # One blocking read at most this long: the socket timeout guards against a dead server.
        self.block = max(0.1, settings.redis_socket_timeout - BLOCK_MARGIN)

    def key(self, job_id: str) -> str:
        return f"{self.namespace}:result:{job_id}"

    @wrap_errors("storing a job result")
    def put(self, job_id: str, job: str, entry: Entry, ttl: float) -> None:
        fields: dict[Any, Any] = {"ok": "1" if entry.ok else "0", "job": job}
        if entry.value is not None:
            fields["value"] = entry.value
        key = self.key(job_id)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.xadd(key, fields, maxlen=MAX_ENTRIES, approximate=False)
            pipe.pexpire(key, int(ttl * 1000))
            pipe.execute()

    @contextmanager
    def watch(self, job_id: str) -> Iterator[Watch]:
        yield _RedisWatch(self, self.key(job_id))

    def close(self) -> None:
        self.client.close()


class _RedisWatch:
    def __init__(self, store: RedisResults, key: str) -> None:
        self.store, self.key = store, key
        self.last = "0-0"

    @wrap_errors("reading a job result")
    def read(self) -> Entry | None:
        entries = cast("list[tuple[bytes, dict[bytes, bytes]]]", self.store.client.xrange(self.key, count=MAX_ENTRIES))
        found: Entry | None = None
        for entry_id, fields in entries:
            self.last = _text(entry_id)
            if fields.get(b"ok") == b"1":
                return Entry(True, _text(fields.get(b"value", b"null")))
            found = Entry(False)
        return found

    @wrap_errors("waiting for a job result")
    def wait(self, timeout: float) -> None:
        block = min(timeout, self.store.block)
        if block > 0:
            self.store.client.xread({self.key: self.last}, count=1, block=max(1, int(block * 1000)))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

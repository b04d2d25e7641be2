"""The Redis stream buffer (redis broker): one Redis Stream per run, entry id ``<seq>-0``.

``streams.lua`` appends a chunk only when its seq is past the stream's last
entry, atomically, so a regenerated chunk is a no-op. Each write extends
the stream's TTL (``CONVEYOR_STREAM_RETENTION``), so finished streams
expire on their own.

A reader waits with ``XREAD BLOCK`` on its own connection (opened for the
stream and closed with it), so a chunk reaches it as soon as it is
written and an idle stream costs one command per wait, not a poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import redis
import redis.asyncio

from conveyor.platform.streams.base import READ_BATCH, Follower, StreamBuffer, StreamEntry
from conveyor.redis_client import translate, wrap_errors

_SCRIPT = (Path(__file__).with_name("streams.lua")).read_text()


class RedisStreamBuffer(StreamBuffer):
    """Chunks in ``<namespace>:run:<run_id>:stream``."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        namespace: str,
        retention: float,
        reader: Callable[[], redis.asyncio.Redis],
        socket_timeout: float,
    ) -> None:
        """``reader`` opens the one-connection async client a follower blocks on; its reads block for less
        than ``socket_timeout`` (its client's)."""
        self.client = client
        self._reader, self._socket_timeout = reader, socket_timeout
        self.namespace = namespace
        self.retention_ms = int(retention * 1000)
        self._script = self.client.register_script(_SCRIPT)

    def _key(self, run_id: str) -> str:
        return f"{self.namespace}:run:{run_id}:stream"

    @wrap_errors("appending to a stream")
    def append(self, run_id: str, seq: int, text: str) -> bool:
        return bool(self._script(keys=[self._key(run_id)], args=["chunk", seq, text, self.retention_ms]))

    @wrap_errors("ending a stream")
    def end(self, run_id: str, status: str) -> None:
        self._script(keys=[self._key(run_id)], args=["end", 0, status, self.retention_ms])

    @wrap_errors("reading a stream")
    def read(self, run_id: str, after: int = 0, limit: int = READ_BATCH) -> list[StreamEntry]:
        rows = self.client.xrange(self._key(run_id), min=f"{after + 1}-0", max="+", count=limit)
        return _entries(rows)

    @asynccontextmanager
    async def follow(self, run_id: str) -> AsyncIterator[Follower]:
        client = self._reader()
        try:
            yield _RedisFollower(client, self._key(run_id), self._socket_timeout)
        finally:
            # A reader that went away (its task cancelled) still gives its connection back.
            await asyncio.shield(client.aclose())

    def close(self) -> None:
        self.client.close()


class _RedisFollower(Follower):
    def __init__(self, client: redis.asyncio.Redis, key: str, socket_timeout: float) -> None:
        self._client, self._key = client, key
        #: A block shorter than the socket's timeout, which would otherwise take a quiet stream for a dead server.
        self._longest = max(0.05, socket_timeout / 2)

    async def entries(self, after: int, timeout: float) -> list[StreamEntry]:
        block_ms = max(1, int(min(timeout, self._longest) * 1000))
        try:
            reply = await self._client.xread({self._key: f"{after}-0"}, count=READ_BATCH, block=block_ms)
        except redis.RedisError as exc:
            raise translate(exc, "reading a stream") from exc
        if isinstance(reply, dict):  # RESP3: {key: [entries]}
            return _entries(next(iter(reply.values()), None))
        return _entries(reply[0][1]) if reply else []


def _entries(rows: Any) -> list[StreamEntry]:
    """Stream entries of an XRANGE or XREAD reply's ``[(id, {k, d}), ...]``."""
    out = []
    for entry_id, fields in rows or []:
        # Bytes, or text when REDIS_URL asks for ``decode_responses``: the URL's options win over ours.
        values = {_text(name): _text(value) for name, value in (fields or {}).items()}
        seq = int(_text(entry_id).split("-", 1)[0])
        kind: Literal["chunk", "end"] = "end" if values["k"] == "end" else "chunk"
        out.append(StreamEntry(seq, kind, values["d"]))
    return out


def _text(value: bytes | str | None) -> str:
    """A Redis reply as text, whether the client decodes replies or not."""
    if isinstance(value, bytes):
        return value.decode()
    return value or ""

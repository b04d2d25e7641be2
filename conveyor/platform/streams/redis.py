"""The Redis stream buffer (redis broker): one Redis Stream per run, entry id ``<seq>-0``.

``streams.lua`` appends a chunk only when its seq is past the stream's last
entry, atomically, so a regenerated chunk is a no-op. Each write extends
the stream's TTL (``CONVEYOR_STREAM_RETENTION``), so finished streams
expire on their own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import redis

from conveyor.platform.streams.base import READ_BATCH, StreamBuffer, StreamEntry
from conveyor.redis_client import wrap_errors

_SCRIPT = (Path(__file__).with_name("streams.lua")).read_text()


class RedisStreamBuffer(StreamBuffer):
    """Chunks in ``<namespace>:run:<run_id>:stream``."""

    def __init__(self, client: redis.Redis, *, namespace: str, retention: float) -> None:
        self.client = client
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
        out = []
        for entry_id, fields in rows or []:
            # Bytes, or text when REDIS_URL asks for ``decode_responses``: the URL's options win over ours.
            values = {_text(name): _text(value) for name, value in (fields or {}).items()}
            seq = int(_text(entry_id).split("-", 1)[0])
            kind: Literal["chunk", "end"] = "end" if values["k"] == "end" else "chunk"
            out.append(StreamEntry(seq, kind, values["d"]))
        return out

    def close(self) -> None:
        self.client.close()


def _text(value: bytes | str | None) -> str:
    """A Redis reply as text, whether the client decodes replies or not."""
    if isinstance(value, bytes):
        return value.decode()
    return value or ""

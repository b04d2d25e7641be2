"""Job records as the dashboard and the API see them, from the hash the script keeps (``$ns:job:$id``)."""

from __future__ import annotations

import json
from typing import Mapping

from conveyor.brokers.base import JobRecord
from conveyor.brokers.redis.replies import text

_MS = 1000


def record_from_hash(job_id: str, raw: Mapping[bytes | str, bytes | str]) -> JobRecord | None:
    """The record, or None when the hash is gone or incomplete. Payload secrets stay as stored (encrypted)."""
    if not raw or b"state" not in raw:
        return None
    row = {text(k): v.decode(errors="replace") if isinstance(v, bytes) else v for k, v in raw.items()}
    try:
        message = json.loads(row.get("payload", "{}"))
        payload = (message.get("args") or [{}])[0]
    except (ValueError, AttributeError, IndexError):
        payload = {}

    def seconds(name: str) -> float | None:
        return int(row[name]) / _MS if row.get(name) else None

    return JobRecord(
        id=job_id,
        queue=row.get("queue", ""),
        job=row.get("job", ""),
        state=row["state"],
        attempts=int(row.get("attempts", 0)),
        key=row.get("key"),
        payload=payload if isinstance(payload, dict) else {},
        error=row.get("error"),
        enqueued_at=seconds("enqueued_at"),
        started_at=seconds("started_at"),
        finished_at=seconds("finished_at"),
        eta=seconds("eta"),
        event=row.get("event") if row["state"] == "awaiting" else None,
        priority=int(row.get("priority") or 0),
        group=row.get("group") or None,
    )

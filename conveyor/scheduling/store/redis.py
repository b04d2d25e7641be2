"""Managed schedules in Redis: one hash, ``<shared namespace>:cron:schedules``, name -> the schedule as JSON.

The key is no queue's (a queue name has no colon: no queue's list is named so), built under the
shared namespace (``{conveyor}`` on a cluster: see conveyor/brokers/redis/keys.py). A pass of the firer reads it with one HGETALL; a pause or
resume is a compare-and-set (``schedules.lua``), so it never undoes a replace made meanwhile.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from conveyor.errors import ScheduleError
from conveyor.logs import log_error
from conveyor.redis_client import wrap_errors
from conveyor.scheduling.store.base import StoredSchedule

if TYPE_CHECKING:
    import redis

_SCRIPT = Path(__file__).with_name("schedules.lua").read_text()

#: Compare-and-set attempts of a pause or resume that keeps losing to concurrent writes.
CAS_TRIES = 8


class RedisSchedules:
    def __init__(self, client: redis.Redis, namespace: str) -> None:
        """``namespace``: the shared namespace (:func:`conveyor.brokers.redis.keys.shared_namespace`)."""
        self.client = client
        self.key = f"{namespace}:cron:schedules"
        self._cas = client.register_script(_SCRIPT)

    @wrap_errors("storing a cron schedule")
    def put(self, schedule: StoredSchedule) -> None:
        self.client.hset(self.key, schedule.name, _encode(schedule))

    @wrap_errors("reading a cron schedule")
    def get(self, name: str) -> StoredSchedule | None:
        raw = cast("bytes | None", self.client.hget(self.key, name))
        return None if raw is None else _decode(name, raw)

    @wrap_errors("reading the cron schedules")
    def list(self) -> list[StoredSchedule]:
        held = cast("dict[bytes, bytes]", self.client.hgetall(self.key))
        out = []
        for name, raw in held.items():
            try:
                out.append(_decode(name.decode(), raw))
            except (ValueError, KeyError, TypeError) as exc:
                # Another version's shape, or a hand edit: the rest of the schedules still fire.
                log_error(f"cron schedule skipped: its stored entry cannot be read ({type(exc).__name__})")
        return sorted(out, key=lambda s: s.name)

    @wrap_errors("pausing or resuming a cron schedule")
    def set_paused(self, name: str, paused: bool, since: datetime | None = None) -> bool:
        for _ in range(CAS_TRIES):
            raw = cast("bytes | None", self.client.hget(self.key, name))
            if raw is None:
                return False
            held = _decode(name, raw)
            new = _encode(replace(held, paused=paused, since=since or held.since))
            written = self._cas(keys=[self.key], args=[name, raw, new])
            if written != -1:
                return bool(written)
        raise ScheduleError("the schedule kept changing while it was paused or resumed: try again")

    @wrap_errors("removing a cron schedule")
    def delete(self, name: str) -> bool:
        return bool(self.client.hdel(self.key, name))

    def close(self) -> None:
        self.client.close()


def _encode(s: StoredSchedule) -> str:
    fields: dict[str, Any] = {"cron": s.cron, "tz": s.tz, "job": s.job, "payload": s.payload}
    return json.dumps({**fields, "paused": s.paused, "since": s.since.isoformat()}, separators=(",", ":"))


def _decode(name: str, raw: bytes) -> StoredSchedule:
    d = json.loads(raw)
    return StoredSchedule(
        name, d["cron"], d["job"], d["payload"], d["tz"], d["paused"], datetime.fromisoformat(d["since"])
    )

"""The worker registry and attempt history in Redis, beside the broker's keys (layout in ``fleet.lua``).

On the broker's own client (``conveyor.redis_client.client``: the settings' timeouts); every
method's redis errors leave translated (``wrap_errors``), as the broker's reads do.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from redis.client import Pipeline

from conveyor.brokers.fleet.base import FORGET_AFTER, AttemptEvent, AttemptInfo, FleetStore, WorkerInfo
from conveyor.redis_client import text, wrap_errors

_SCRIPT = Path(__file__).with_name("fleet.lua").read_text()

_SEP = "\x1f"

#: Attempt events written per script call.
ATTEMPTS_PER_CALL = 200


class RedisFleetStore(FleetStore):
    counts_enqueues = True  # jobs.lua's enqueue, in the same script call

    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        *,
        dedup_keys: Callable[[str], list[str]] | None = None,
        enqueued_keys: Callable[[], list[str]] | None = None,
    ) -> None:
        """``namespace``: the broker's ``keys.shared``; ``dedup_keys(key)``: where the broker may hold ``key``;
        ``enqueued_keys()``: the hashes the broker's enqueue counts new jobs in (the broker's ``enqueued_keys``)."""
        self.client = client
        self.ns = namespace
        self._dedup_keys = dedup_keys or (lambda key: [f"{namespace}:dedup:{key}"])
        self._enqueued_keys = enqueued_keys or (lambda: [f"{namespace}:fleet:enqueued"])
        self._script = client.register_script(_SCRIPT)

    def _call(self, *args: str | int, client: Pipeline | None = None) -> Any:
        return self._script(keys=[self.ns], args=list(args), client=client)

    @wrap_errors("a worker's heartbeat")
    def beat(self, info: WorkerInfo, *, keep: float) -> None:
        self._call("beat", info.id, int(keep * 1000), *_fields(info))

    @wrap_errors("a worker's leaving")
    def leave(self, info: WorkerInfo, reason: str) -> None:
        self._call("leave", info.id, reason, "in_flight", "[]", "done", info.done, "failed", info.failed)

    @wrap_errors("the worker sweep")
    def sweep(self, gone_after: float) -> int:
        return int(self._call("sweep", int(gone_after * 1000), int(FORGET_AFTER * 1000)))

    @wrap_errors("reading the workers")
    def workers(self) -> tuple[float, list[WorkerInfo]]:
        seconds, micros = self.client.time()
        now = seconds + micros / 1e6
        ids = [text(i) for i in self.client.zrevrange(f"{self.ns}:fleet:workers", 0, -1)]
        with self.client.pipeline(transaction=False) as pipe:
            for worker_id in ids:
                pipe.hgetall(f"{self.ns}:fleet:worker:{worker_id}")
            rows = pipe.execute()
        out = []
        for worker_id, raw in zip(ids, rows):
            if raw:
                out.append(_worker(worker_id, {text(k): text(v) for k, v in raw.items()}))
        return now, out

    @wrap_errors("writing attempts")
    def write_attempts(self, events: list[AttemptEvent], *, keep: float) -> None:
        # Slices of ATTEMPTS_PER_CALL: each script call blocks Redis while it runs.
        with self.client.pipeline(transaction=False) as pipe:
            for start in range(0, len(events), ATTEMPTS_PER_CALL):
                chunk = events[start : start + ATTEMPTS_PER_CALL]
                args: list[str | int] = []
                for e in chunk:
                    args += [
                        e.kind,
                        e.job_id,
                        e.token,
                        e.attempt,
                        e.worker,
                        int(e.age * 1000),
                        e.outcome or "",
                        e.error or "",
                        e.traceback or "",
                        int((e.start_age or 0) * 1000),
                    ]
                self._call("attempts", int(keep * 1000), len(chunk), *args, client=pipe)
            pipe.execute()

    @wrap_errors("reading attempts")
    def attempts(self, job_id: str) -> list[AttemptInfo]:
        raw = self.client.hgetall(f"{self.ns}:attempts:{job_id}")
        out = []
        for value in raw.values():
            entry = json.loads(value)
            out.append(
                AttemptInfo(
                    attempt=int(entry.get("attempt", 0)),
                    worker=entry.get("worker", ""),
                    started_at=_seconds(entry.get("started_at")),
                    ended_at=_seconds(entry.get("ended_at")),
                    outcome=entry.get("outcome"),
                    error=entry.get("error"),
                    traceback=entry.get("traceback"),
                )
            )
        return sorted(out, key=lambda a: (a.started_at or a.ended_at or 0, a.attempt))

    def count_enqueued(self, counts: dict[tuple[str, str], int]) -> None:
        pass  # the broker's enqueue script counted them, in the same call (jobs.lua enqueue_one)

    @wrap_errors("reading enqueue totals")
    def enqueued_totals(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        with self.client.pipeline(transaction=False) as pipe:
            for name in self._enqueued_keys():
                pipe.hgetall(name)
            hashes = pipe.execute()
        for counted in hashes:
            for name, value in counted.items():
                queue, _, job = text(name).partition(_SEP)
                out[(queue, job)] = out.get((queue, job), 0) + int(value)
        return out

    @wrap_errors("finding a job by key")
    def find_by_key(self, key: str) -> list[str]:
        # The broker's own dedup entries ($ns:dedup:$key, see redis/jobs.lua; one per queue on a cluster):
        # held while the key's TTL runs.
        with self.client.pipeline(transaction=False) as pipe:
            for name in self._dedup_keys(key):
                pipe.get(name)
            found = pipe.execute()
        return [text(job_id) for job_id in found if job_id]


def _fields(info: WorkerInfo) -> list[str | int]:
    return [
        "host",
        info.host,
        "pid",
        info.pid,
        "queues",
        json.dumps(info.queues),
        "threads",
        info.threads,
        "version",
        info.version,
        "in_flight",
        json.dumps(info.in_flight),
        "done",
        info.done,
        "failed",
        info.failed,
    ]


def _seconds(ms: int | str | None) -> float | None:
    return int(ms) / 1000 if ms not in (None, "") else None


def _worker(worker_id: str, row: dict[str, str]) -> WorkerInfo:
    return WorkerInfo(
        id=worker_id,
        host=row.get("host", "?"),
        pid=int(row.get("pid") or 0),
        queues=json.loads(row.get("queues") or "[]"),
        threads=int(row.get("threads") or 0),
        version=row.get("version", ""),
        started_at=_seconds(row.get("started_at")),
        heartbeat_at=_seconds(row.get("heartbeat_at")),
        in_flight=json.loads(row.get("in_flight") or "[]"),
        done=int(row.get("done") or 0),
        failed=int(row.get("failed") or 0),
        gone_at=_seconds(row.get("gone_at")),
        gone_reason=row.get("gone_reason"),
    )

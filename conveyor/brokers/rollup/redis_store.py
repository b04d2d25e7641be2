"""The rollup in Redis: one hash per queue and minute with a TTL (layout in ``rollup.lua``).

A flush is one script call per :data:`GROUPS_PER_CALL` groups, all in one
pipeline (one round trip); each call claims its own flush id first, so a
retried flush that had in fact landed adds nothing. Expiry does the pruning.
"""

from __future__ import annotations

from pathlib import Path

import redis
from redis.client import Pipeline

from conveyor.brokers.rollup.base import (
    BUCKETS,
    COUNTERS,
    FLUSH_ID_SECONDS,
    KEEP_SECONDS,
    MinuteRow,
    RollupStore,
    Tally,
    TallyGroup,
)
from conveyor.redis_client import text, wrap_errors

_SCRIPT = Path(__file__).with_name("rollup.lua").read_text()

_SEP = "\x1f"

#: Groups written per script call: each call blocks Redis while it runs.
GROUPS_PER_CALL = 200

#: A minute's hash outlives its minute by this much (ms): the longest window plus slack.
_KEEP_MS = (KEEP_SECONDS + 120) * 1000


class RedisRollupStore(RollupStore):
    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self.client = client
        self.ns = namespace
        self._script = client.register_script(_SCRIPT)

    def _call(self, *args: str | int, client: Pipeline | None = None) -> object:
        return self._script(keys=[self.ns], args=list(args), client=client)

    @wrap_errors("writing the rollup")
    def write(self, flush_id: str, groups: list[TallyGroup]) -> bool:
        with self.client.pipeline(transaction=False) as pipe:
            for part, start in enumerate(range(0, max(1, len(groups)), GROUPS_PER_CALL)):
                chunk = groups[start : start + GROUPS_PER_CALL]
                args: list[str | int] = []
                for g in chunk:
                    fields = _fields(g.tally)
                    args += [g.queue, g.job, int(g.age * 1000), len(fields) // 2, *fields]
                self._call(
                    "add", f"{flush_id}.{part}", _KEEP_MS, FLUSH_ID_SECONDS * 1000, len(chunk), *args, client=pipe
                )
            results = pipe.execute()
        return any(int(r) for r in results)

    @wrap_errors("sampling queue depth")
    def sample_depth(self, depths: dict[str, int]) -> None:
        if not depths:
            return
        args: list[str | int] = []
        for queue, n in sorted(depths.items()):
            args += [queue, n]
        self._call("depth", _KEEP_MS, *args)

    @wrap_errors("reading the rollup")
    def read(self, queue: str | None, seconds: float) -> tuple[int, list[MinuteRow]]:
        now = int(self.client.time()[0])
        queues = (
            [queue] if queue is not None else sorted(text(q) for q in self.client.smembers(f"{self.ns}:rollup:queues"))
        )
        last = now - now % 60
        first = last - int(seconds) // 60 * 60
        keys = [(q, m) for q in queues for m in range(first, last + 60, 60)]
        with self.client.pipeline(transaction=False) as pipe:
            for q, m in keys:
                pipe.hgetall(f"{self.ns}:rollup:{q}:{m}")
            hashes = pipe.execute()
        rows = []
        for (q, m), raw in zip(keys, hashes):
            if raw:
                rows += _rows(q, m, {text(k): int(v) for k, v in raw.items()})
        rows.sort(key=lambda r: (r.minute, r.queue, r.job))
        return now, rows

    def prune(self) -> int:
        return 0  # every minute's hash expires by itself


def _fields(tally: Tally) -> list[str | int]:
    """The hash fields a tally adds to (non-zero ones only), as field, count pairs."""
    out: list[str | int] = []
    for name in COUNTERS:
        n = getattr(tally, name)
        if n:
            out += [name, n]
    for prefix, hist in (("w", tally.wait), ("r", tally.run)):
        for i, n in enumerate(hist):
            if n:
                out += [f"{prefix}{i}", n]
    return out


def _rows(queue: str, minute: int, fields: dict[str, int]) -> list[MinuteRow]:
    """A minute's hash as rows: one per job type, and the depth sample as job ""."""
    tallies: dict[str, Tally] = {}
    depth = None
    for key, n in fields.items():
        job, _, name = key.rpartition(_SEP)
        if name == "depth" and job == "":
            depth = n
            continue
        tally = tallies.setdefault(job, Tally())
        if name in COUNTERS:
            setattr(tally, name, n)
        elif name[:1] in ("w", "r") and name[1:].isdigit() and int(name[1:]) < BUCKETS:
            (tally.wait if name[0] == "w" else tally.run)[int(name[1:])] = n
    rows = [MinuteRow(minute, queue, job, tally) for job, tally in sorted(tallies.items())]
    if depth is not None:
        rows.append(MinuteRow(minute, queue, "", Tally(), depth))
    return rows

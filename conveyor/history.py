"""The charts' history as the dashboard and the admin API read it: plain dataclasses, no HTTP.

Reads the per-minute rollup (:mod:`conveyor.brokers.rollup`) of the last
hour (a point a minute) or day (a point every five minutes), merges job
types and processes, and reads percentiles off the summed buckets.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field, replace

from conveyor.brokers.rollup import MinuteRow, RollupStore, Tally, percentile
from conveyor.errors import InvalidQuery

#: The windows a chart shows: name -> (seconds, seconds per point).
WINDOWS: dict[str, tuple[int, int]] = {"1h": (3600, 60), "24h": (24 * 3600, 300)}

#: The window shown when none is asked for.
DEFAULT_WINDOW = "1h"

#: Seconds after its end that a minute is taken as settled: flushes come every few seconds (at most 60).
SETTLED_SECONDS = 180

#: Seconds a window's settled minutes are reused before they are all read again. A live page reads only
#: the last few minutes at each refresh (a day of six queues is ~8,600 hashes on Redis, ~1.5 s to parse);
#: counts flushed later than SETTLED_SECONDS (a store away for minutes) show within this time.
REUSE_SECONDS = 300


@dataclass(frozen=True)
class HistoryPoint:
    """One point of a chart: what happened in ``[at, at + step)`` (UNIX seconds, the store's clock)."""

    at: int
    enqueued: int
    completed: int
    #: Jobs failed for good (their attempts spent, or a permanent error).
    failed: int
    #: Retries scheduled (failed attempts that will run again).
    retried: int
    #: Percentiles of the attempts started / ended in the point (s), None when none.
    wait_p50: float | None
    wait_p95: float | None
    run_p50: float | None
    run_p95: float | None
    #: Jobs waiting at the point's last sample, None when not sampled.
    depth: int | None


@dataclass(frozen=True)
class QueueHistory:
    """A window of a queue's (or, with ``queue`` None, every queue's) history, oldest point first."""

    queue: str | None
    job: str | None
    window: str
    #: Seconds per point.
    step: int
    #: The store server's now (UNIX s).
    now: int
    points: list[HistoryPoint] = field(default_factory=list)

    @property
    def totals(self) -> dict[str, int]:
        """The window's sums of each count."""
        return {
            name: sum(getattr(p, name) for p in self.points) for name in ("enqueued", "completed", "failed", "retried")
        }


def check_window(window: str) -> str:
    """``window`` when it is one of :data:`WINDOWS`; else :class:`InvalidQuery` (not echoing it)."""
    if window not in WINDOWS:
        raise InvalidQuery(f"window is one of {', '.join(WINDOWS)}")
    return window


def read_history(
    store: RollupStore, queue: str | None, window: str, *, job: str | None = None, depth_now: int | None = None
) -> QueueHistory:
    """The window's points from ``store``; ``depth_now`` (read live) is the last point's depth (samples lag a minute)."""
    seconds, step = WINDOWS[check_window(window)]
    now, rows = _read(store, queue, seconds)
    last = now - now % step
    starts = list(range(last - seconds + step, last + step, step))
    tallies = {at: Tally() for at in starts}
    depths: dict[int, tuple[int, int]] = {}  # point -> (minute of the latest sample, sum over queues)
    for row in rows:
        at = row.minute - row.minute % step
        if at not in tallies:
            continue
        if row.job == "":
            _add_depth(depths, at, row)
        elif job is None or row.job == job:
            tallies[at].add(row.tally)
    points = []
    for at in starts:
        t = tallies[at]
        depth = depths.get(at)
        points.append(
            HistoryPoint(
                at=at,
                enqueued=t.enqueued,
                completed=t.completed,
                failed=t.failed,
                retried=t.retried,
                wait_p50=percentile(t.wait, 0.5),
                wait_p95=percentile(t.wait, 0.95),
                run_p50=percentile(t.run, 0.5),
                run_p95=percentile(t.run, 0.95),
                depth=depth[1] if depth else None,
            )
        )
    if points and depth_now is not None:
        points[-1] = _with_depth(points[-1], depth_now)
    return QueueHistory(queue=queue, job=job, window=window, step=step, now=now, points=points)


def _add_depth(depths: dict[int, tuple[int, int]], at: int, row: MinuteRow) -> None:
    """Keep each point's latest minute's samples (summed over queues when several are read)."""
    if row.depth is None:
        return
    minute, total = depths.get(at, (row.minute, 0))
    if row.minute > minute:
        depths[at] = (row.minute, row.depth)
    elif row.minute == minute:
        depths[at] = (minute, total + row.depth)


def _with_depth(point: HistoryPoint, depth: int) -> HistoryPoint:
    return replace(point, depth=depth)


@dataclass(frozen=True)
class _Settled:
    at: float  # monotonic
    cutoff: int  # minutes before this are reused
    rows: list[MinuteRow]


_settled: "weakref.WeakKeyDictionary[RollupStore, dict[tuple[str | None, int], _Settled]]" = weakref.WeakKeyDictionary()
_settled_lock = threading.Lock()


def _read(store: RollupStore, queue: str | None, seconds: int) -> tuple[int, list[MinuteRow]]:
    """The store's rows of the window: the settled minutes of an earlier read (under REUSE_SECONDS old) and
    the recent ones read now, or everything read now."""
    mono = time.monotonic()
    with _settled_lock:
        entry = _settled.setdefault(store, {}).get((queue, seconds))
    if entry is not None and mono - entry.at < REUSE_SECONDS:
        now, recent = store.read(queue, SETTLED_SECONDS + 120 + (mono - entry.at))
        old = [r for r in entry.rows if r.minute < entry.cutoff]
        return now, old + [r for r in recent if r.minute >= entry.cutoff]
    now, rows = store.read(queue, seconds)
    with _settled_lock:
        _settled[store][(queue, seconds)] = _Settled(mono, now - now % 60 - SETTLED_SECONDS, rows)
    return now, rows

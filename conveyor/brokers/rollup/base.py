"""The rollup's records, its histogram buckets and the store interface each broker's rollup store implements.

Apart from :mod:`conveyor.brokers.rollup` so the stores can import them without
importing the package that chooses among them (no ``__init__`` loop).

Wait and run times are kept as counts in fixed log-scale buckets, not as
percentiles: buckets of one minute written by several processes add up,
and a percentile of any window is read off the summed buckets (to within a
bucket's width, about 19 %).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: Seconds of history kept: the dashboard's longest window.
KEEP_SECONDS = 24 * 3600

#: How long a store keeps a flush's id to refuse it a second time (s): longer than any retry of it.
FLUSH_ID_SECONDS = 3600

#: Counters of a (minute, queue, job) row, in the stores' order.
COUNTERS = ("enqueued", "completed", "failed", "retried")

#: The histograms' buckets: bucket 0 holds times under :data:`BUCKET_BASE`, bucket ``i`` (1 ≤ i < N)
#: times in [BASE·2^((i-1)/2), BASE·2^(i/2)), the last one everything longer (over ~5 h).
BUCKET_BASE = 0.001
BUCKETS = 50


def bucket_of(seconds: float) -> int:
    """The histogram bucket of a duration."""
    if seconds < BUCKET_BASE:
        return 0
    return min(BUCKETS - 1, 1 + int(2 * math.log2(seconds / BUCKET_BASE)))


def bucket_value(index: int) -> float:
    """The duration a bucket stands for: its geometric middle (0 for the first)."""
    if index <= 0:
        return 0.0
    return BUCKET_BASE * 2 ** ((index - 0.5) / 2)


def percentile(hist: list[int], q: float) -> float | None:
    """The ``q`` quantile (0-1) of a histogram, None when it is empty."""
    total = sum(hist)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index, n in enumerate(hist):
        seen += n
        if n and seen >= rank:
            return bucket_value(index)
    return bucket_value(len(hist) - 1)


def empty_hist() -> list[int]:
    return [0] * BUCKETS


@dataclass
class Tally:
    """What one process counted for one (queue, job) in one second, or a store's row for one minute."""

    enqueued: int = 0
    completed: int = 0
    failed: int = 0
    retried: int = 0
    wait: list[int] = field(default_factory=empty_hist)
    run: list[int] = field(default_factory=empty_hist)

    def add(self, other: Tally) -> None:
        self.enqueued += other.enqueued
        self.completed += other.completed
        self.failed += other.failed
        self.retried += other.retried
        self.wait = [a + b for a, b in zip(self.wait, other.wait)]
        self.run = [a + b for a, b in zip(self.run, other.run)]


@dataclass(frozen=True)
class TallyGroup:
    """One group of a flush: what happened ``age`` seconds before the write, for one queue and job type.

    The store dates it by its server's clock (``now - age``), so a worker host whose clock
    lies never files its counts under the wrong minute.
    """

    queue: str
    job: str
    age: float
    tally: Tally


@dataclass(frozen=True)
class MinuteRow:
    """One minute of one queue and job type as the store holds it; ``minute`` is UNIX seconds (a multiple of 60)."""

    minute: int
    queue: str
    job: str
    tally: Tally
    #: Jobs waiting at the minute's last sample (rows of job ""), None when not sampled.
    depth: int | None = None


class RollupStore:
    """Where the per-minute rollup lives; one implementation per broker."""

    def write(self, flush_id: str, groups: list[TallyGroup]) -> bool:
        """Add a flush's groups to their minutes in one batched write; False when ``flush_id`` was written before.

        Idempotent by ``flush_id``: a flush retried after a timeout that had in fact landed is not added twice.
        """
        raise NotImplementedError

    def sample_depth(self, depths: dict[str, int]) -> None:
        """Record each queue's waiting jobs in the current minute (the last sample of a minute wins)."""
        raise NotImplementedError

    def read(self, queue: str | None, seconds: float) -> tuple[int, list[MinuteRow]]:
        """(the server's now, the rows of the last ``seconds``), of one queue or every queue."""
        raise NotImplementedError

    def prune(self) -> int:
        """Forget minutes older than :data:`KEEP_SECONDS` (and old flush ids); how many rows went."""
        raise NotImplementedError

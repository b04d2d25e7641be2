"""What a benchmark job does: stamp shared memory, so the parent can see progress without asking a broker.

Every system under test runs the same job body, :func:`hit`, whatever its
API: it counts the job, stamps the time of the process's first and latest
job, and, when the payload carries an enqueue time, writes this job's
enqueue-to-start latency into its own slot. The parent reads the arrays;
nobody polls a queue or a database to learn that jobs ran, so the
measurement adds the same (tiny) cost to every peer.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from multiprocessing.sharedctypes import RawArray
from typing import Any


@dataclass
class Probe:
    """Shared arrays for ``slots`` worker processes and ``latency_slots`` timed jobs."""

    done: Any  # RawArray('q'): jobs run, per process slot
    first: Any  # RawArray('d'): time.time() of a slot's first job
    last: Any  # RawArray('d'): time.time() of a slot's latest job
    latency: Any  # RawArray('d'): seconds from enqueue to start, per job index (NaN until it ran)

    @classmethod
    def create(cls, slots: int, latency_slots: int = 0) -> "Probe":
        latency = RawArray("d", max(latency_slots, 1))
        for i in range(len(latency)):
            latency[i] = math.nan
        return cls(RawArray("q", slots), RawArray("d", slots), RawArray("d", slots), latency)

    def total(self) -> int:
        """Jobs run so far, all processes together."""
        return sum(self.done)

    def span(self) -> float:
        """Seconds from the first job's start, in any process, to the latest job's."""
        firsts = [t for t in self.first if t]
        return max(self.last) - min(firsts) if firsts else 0.0

    def latencies(self, count: int) -> list[float]:
        """Latencies (seconds) of jobs ``0..count-1`` that ran."""
        return [x for x in self.latency[:count] if not math.isnan(x)]


# -- in a worker process --------------------------------------------------------

_probe: Probe | None = None
_slot = 0
_lock = threading.Lock()


def attach(probe: Probe, slot: int) -> None:
    """Make this process's job bodies write to ``slot`` of ``probe``."""
    global _probe, _slot
    _probe, _slot = probe, slot


def hit(payload: dict) -> None:
    """The job body of every benchmark job: count it, and note its latency when timed.

    ``payload`` is ``{"i": index, "t": enqueue time or 0}``.
    """
    now = time.time()
    probe = _probe
    if probe is None:  # a job run outside the harness (a stray test run): nothing to record
        return
    sent = payload.get("t") or 0
    index = payload.get("i", -1)
    if sent and 0 <= index < len(probe.latency):
        probe.latency[index] = now - sent
    # One lock per process: 8 threads bump one counter, and a count that
    # went backwards would make the parent wait for jobs that already ran.
    with _lock:
        probe.done[_slot] += 1
        probe.last[_slot] = now
        if not probe.first[_slot]:
            probe.first[_slot] = now

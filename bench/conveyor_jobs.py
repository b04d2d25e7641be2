"""The benchmark's job type for conveyor: ``bench.noop``, loaded with ``CONVEYOR_IMPORTS=bench.conveyor_jobs``.

It runs through conveyor's whole path (payload model, processor, context),
and its body is the same :func:`bench.probe.hit` every peer runs.
"""

from __future__ import annotations

from conveyor.tasks.context import JobContext
from conveyor.tasks.payloads import Payload
from conveyor.tasks.registry import job

from . import probe

#: The queue the no-op runs on: its concurrency is replaced by the harness's thread count.
QUEUE = "agent"


class Tick(Payload):
    """A job's index, and when it was enqueued (0 when not timed)."""

    i: int
    t: float = 0.0


@job("bench.noop", queue=QUEUE, payload=Tick)
def noop(payload: Tick, ctx: JobContext) -> None:
    probe.hit({"i": payload.i, "t": payload.t})

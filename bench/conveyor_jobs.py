"""The benchmark's job type for conveyor: ``bench.noop``, loaded with ``CONVEYOR_IMPORTS=bench.conveyor_jobs``.

It runs through conveyor's whole path (payload model, processor, context),
and its body is the same :func:`bench.probe.hit` every peer runs.
"""

from __future__ import annotations

from conveyor.blueprints import Jobs
from conveyor.platform.queues import AGENT
from conveyor.tasks.context import JobContext
from conveyor.tasks.payloads import Payload

from . import probe

#: The queue the no-op runs on: its concurrency is replaced by the harness's thread count.
QUEUE = AGENT.name

#: Its own blueprint (the App includes it through CONVEYOR_IMPORTS), so importing this module
#: registers nothing on the process-wide default one.
jobs = Jobs()


class Tick(Payload):
    """A job's index, and when it was enqueued (0 when not timed)."""

    i: int
    t: float = 0.0


@jobs.job("bench.noop", queue=AGENT, payload=Tick)
def noop(payload: Tick, ctx: JobContext) -> None:
    probe.hit({"i": payload.i, "t": payload.t})

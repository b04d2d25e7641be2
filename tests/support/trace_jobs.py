"""Job types for the tracing tests (CONVEYOR_IMPORTS=tests.support.trace_jobs): a parent that enqueues
two children, one that fails its first attempt (a retry) and one that always fails (a final failure)."""

from __future__ import annotations

from typing import ClassVar

from conveyor.blueprints import Jobs
from conveyor.errors import JobError
from conveyor.platform.queues import INDEXING
from conveyor.tasks.context import JobContext
from conveyor.tasks.payloads import Payload

jobs = Jobs()


class TraceWork(Payload):
    n: int = 0


@jobs.job("trace.parent", queue=INDEXING, payload=TraceWork)
def parent(payload: TraceWork, ctx: JobContext) -> None:
    ctx.app.jobs.enqueue("trace.child", {"n": payload.n})
    ctx.app.jobs.enqueue("trace.doomed", {"n": payload.n})


@jobs.job("trace.child", queue=INDEXING, payload=TraceWork, max_attempts=3)
def child(payload: TraceWork, ctx: JobContext) -> None:
    if ctx.attempt == 1:
        raise JobError("trace.child fails its first attempt on purpose")


@jobs.job("trace.doomed", queue=INDEXING, payload=TraceWork, max_attempts=2)
def doomed(payload: TraceWork, ctx: JobContext) -> None:
    raise JobError("trace.doomed always fails")


class TraceLeak(Payload):
    """A payload with a secret field that the job's error quotes: no span may carry it."""

    secret_fields: ClassVar[frozenset[str]] = frozenset({"api_key"})

    api_key: str = ""


@jobs.job("trace.leak", queue=INDEXING, payload=TraceLeak, max_attempts=1)
def leak(payload: TraceLeak, ctx: JobContext) -> None:
    raise RuntimeError(f"provider refused key {payload.api_key}")

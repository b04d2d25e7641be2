"""An example job module for an image FROM conveyor's (compose/jobs-image/Dockerfile).

Loaded with ``CONVEYOR_IMPORTS=myjobs``: its queue gets a worker service of its own
(``conveyor worker --queues reports``), its job is enqueued like any other:
``conveyor enqueue reports.size --payload '{"path": "/data", "bytes": 123456789}'``.
"""

from __future__ import annotations

from conveyor.logs import log_event
from conveyor.tasks.context import JobContext
from conveyor.tasks.payloads import Payload
from conveyor.tasks.queues import Queue, declare_queue
from conveyor.tasks.registry import job

# name, concurrency, max attempts, min and max backoff (s), time limit (s), why it is a queue of its own.
REPORTS = declare_queue(Queue("reports", 4, 5, 1.0, 60.0, 300, "reports may be slow: never behind charges"))


class SizeReport(Payload):
    path: str
    bytes: int


@job("reports.size", queue=REPORTS, payload=SizeReport)
def size_report(payload: SizeReport, ctx: JobContext) -> None:
    import humanize  # the package the image adds (imported here: the module also loads where it is absent)

    log_event(
        "report",
        queue=ctx.queue,
        job=ctx.job,
        job_id=ctx.job_id,
        attempt=ctx.attempt,
        size=humanize.naturalsize(payload.bytes),
    )

"""conveyor: Celery-style distributed jobs, on Dramatiq; the agent platform is one blueprint among others.

The public API, everything a user's job module needs::

    from conveyor import App, Jobs, JobContext, Payload, Queue

    jobs = Jobs()
    EMAILS = Queue("emails", concurrency=8, max_attempts=5)

    class SendEmail(Payload):
        to: str

    @jobs.job("email.send", queue=EMAILS, payload=SendEmail)
    def send_email(payload: SendEmail, ctx: JobContext) -> None:
        ...

    app = App(jobs=[jobs])
    send_email.enqueue({"to": "a@example.com"}, key="welcome:a@example.com")

Run its workers with ``CONVEYOR_PLATFORM=false CONVEYOR_IMPORTS=mymodule conveyor worker``:
the worker's App includes every blueprint a CONVEYOR_IMPORTS module holds. The module-level
``@job`` and ``on_final_failure`` register on a default blueprint, for the simplest case.
"""

from conveyor.app import App
from conveyor.blueprints import Enqueued, JobHandle, Jobs, Queue
from conveyor.errors import PermanentError, RetryLater
from conveyor.tasks.context import JobContext
from conveyor.tasks.payloads import Payload
from conveyor.tasks.registry import job, on_final_failure
from conveyor.version import __version__

__all__ = [
    "App",
    "Enqueued",
    "JobContext",
    "JobHandle",
    "Jobs",
    "Payload",
    "PermanentError",
    "Queue",
    "RetryLater",
    "job",
    "on_final_failure",
    "__version__",
]

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

from importlib import import_module
from typing import TYPE_CHECKING, Any

from conveyor.version import __version__

if TYPE_CHECKING:
    from conveyor.app import App
    from conveyor.blueprints import Enqueued, JobHandle, Jobs, Queue
    from conveyor.budgets.base import Budget
    from conveyor.errors import PermanentError, RetryLater
    from conveyor.interrupts import JobCancelled
    from conveyor.tasks.context import JobContext
    from conveyor.tasks.payloads import Payload
    from conveyor.tasks.registry import job, on_final_failure

#: Where each public name lives. Imported on first use (PEP 562), so ``conveyor --help`` and
#: other commands that never build an App don't pay for Dramatiq, the brokers and the middleware.
_PUBLIC = {
    "App": "conveyor.app",
    "Budget": "conveyor.budgets.base",
    "Enqueued": "conveyor.blueprints",
    "JobHandle": "conveyor.blueprints",
    "Jobs": "conveyor.blueprints",
    "Queue": "conveyor.blueprints",
    "PermanentError": "conveyor.errors",
    "RetryLater": "conveyor.errors",
    "JobCancelled": "conveyor.interrupts",
    "JobContext": "conveyor.tasks.context",
    "Payload": "conveyor.tasks.payloads",
    "job": "conveyor.tasks.registry",
    "on_final_failure": "conveyor.tasks.registry",
}


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'conveyor' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "App",
    "Budget",
    "Enqueued",
    "JobCancelled",
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

"""conveyor: Celery-style distributed jobs for AI-agent platforms, on Dramatiq.

The public API, everything a user's job module needs::

    from conveyor import App, job, on_final_failure, Payload, Queue

    EMAILS = Queue("emails", concurrency=8, max_attempts=5)

    class SendEmail(Payload):
        to: str

    @job("email.send", queue=EMAILS, payload=SendEmail)
    def send_email(payload: SendEmail, ctx) -> None:
        ...

Run it with ``CONVEYOR_IMPORTS=mymodule conveyor worker`` (``CONVEYOR_PLATFORM=false``
leaves the agent platform's jobs and queues out); enqueue with
``App().jobs.enqueue("email.send", {"to": "a@example.com"})``.
"""

from conveyor.app import App
from conveyor.tasks.payloads import Payload
from conveyor.tasks.queues import Queue
from conveyor.tasks.registry import job, on_final_failure
from conveyor.version import __version__

__all__ = ["App", "Payload", "Queue", "job", "on_final_failure", "__version__"]

"""The base of conveyor's middleware: Dramatiq's hooks plus the two conveyor adds, as no-ops.

``after_enqueue_jobs`` runs once per batch the JobQueue enqueued (what was sent and
what was a duplicate); ``after_job_dead`` runs once when a job has spent its attempts;
``after_unknown_job`` when a consumer hands back a job of a type this process does not know.
A middleware overrides what it needs; the App and the JobQueue call the hook on every
:class:`ConveyorMiddleware` (Dramatiq's own middleware has neither hook).
"""

from __future__ import annotations

from typing import cast

from dramatiq import Broker, Middleware

from conveyor.brokers.base import AnyMessage, ConveyorBroker, EnqueueItem, JobRef


class ConveyorMiddleware(Middleware):
    """Dramatiq middleware that may also hear of enqueued batches and dead jobs."""

    def after_enqueue_jobs(self, broker: ConveyorBroker, items: list[EnqueueItem], refs: list[JobRef]) -> None:
        """Called after a batch was enqueued: ``items`` as sent, ``refs`` the outcome of each."""

    def after_job_dead(self, broker: ConveyorBroker, message: AnyMessage, error: str) -> None:
        """Called once when ``message``'s job has spent its attempts, after its job type's hook."""

    def after_unknown_job(self, broker: ConveyorBroker, message: AnyMessage) -> None:
        """Called when a consumer handed back ``message`` unattempted: no actor of its type is declared here."""


def conveyor_broker(broker: Broker) -> ConveyorBroker:
    """The broker a hook got, as the conveyor broker it is.

    Dramatiq types its hooks' ``broker`` as any ``Broker``; conveyor's middleware
    runs only on the brokers the App builds, each a :class:`ConveyorBroker`.
    """
    return cast(ConveyorBroker, broker)


def conveyor_middleware(broker: Broker) -> list[ConveyorMiddleware]:
    """``broker``'s conveyor middleware, in order."""
    return [m for m in broker.middleware if isinstance(m, ConveyorMiddleware)]

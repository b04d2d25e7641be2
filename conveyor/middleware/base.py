"""The base of conveyor's middleware: Dramatiq's hooks plus the two conveyor adds, as no-ops.

``after_enqueue_jobs`` runs once per batch the JobQueue enqueued (what was sent and
what was a duplicate); ``after_job_dead`` runs once when a job has spent its attempts.
A middleware overrides what it needs; the App and the JobQueue call the hook on every
:class:`ConveyorMiddleware` (Dramatiq's own middleware has neither hook).
"""

from __future__ import annotations

from typing import Any

from dramatiq import Middleware


class ConveyorMiddleware(Middleware):
    """Dramatiq middleware that may also hear of enqueued batches and dead jobs."""

    def after_enqueue_jobs(self, broker: Any, items: list, refs: list) -> None:
        """Called after a batch was enqueued: ``items`` as sent, ``refs`` the outcome of each."""

    def after_job_dead(self, broker: Any, message: Any, error: str) -> None:
        """Called once when ``message``'s job has spent its attempts, after its job type's hook."""


def conveyor_middleware(broker: Any) -> list[ConveyorMiddleware]:
    """``broker``'s conveyor middleware, in order."""
    return [m for m in broker.middleware if isinstance(m, ConveyorMiddleware)]

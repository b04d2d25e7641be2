"""Logs ``active`` and ``completed`` lines with the run's duration."""

from __future__ import annotations

import time
from typing import Any

from dramatiq import Broker
from dramatiq.broker import MessageProxy

from conveyor.brokers.base import CANCELLED
from conveyor.logs import log_event
from conveyor.middleware.base import ConveyorMiddleware


class Events(ConveyorMiddleware):
    """One JSON line when a job starts and one when it completes."""

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        message.options["started_monotonic"] = time.monotonic()
        log_event(
            "active",
            queue=message.queue_name,
            job=message.actor_name,
            job_id=message.message_id,
            attempt=message.options.get("attempt"),
            waited_ms=max(0, int(time.time() * 1000) - message.message_timestamp),
        )

    def after_process_message(
        self, broker: Broker, message: MessageProxy, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        # Popped on every outcome: a retried message must not carry it along.
        started = message.options.pop("started_monotonic", None)
        if message.options.get(CANCELLED):
            return  # conveyor.middleware.cancel logs its "cancelled" event
        if exception is None:
            duration = round(time.monotonic() - started, 6) if started else None
            log_event(
                "completed",
                queue=message.queue_name,
                job=message.actor_name,
                job_id=message.message_id,
                attempt=message.options.get("attempt"),
                duration_s=duration,
            )

"""Tells a chat channel, once per job, when a job has spent its retries.

``JOB_FAILURE_WEBHOOK_URL`` turns it on; the body is Slack's, Discord's or
generic JSON (``CONVEYOR_WEBHOOK_FORMAT``, else guessed from the URL), with
a link to the job in the dashboard when ``CONVEYOR_PUBLIC_URL`` is set.
The alert is handed to a background sender (:class:`~conveyor.alerts.WebhookSender`),
so a slow or dead receiver never holds up or breaks a worker.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

from dramatiq import Broker, Worker
from dramatiq.common import q_name

from conveyor.alerts import Alert, WebhookSender, guess_format
from conveyor.brokers.base import AnyMessage, ConveyorBroker
from conveyor.middleware.base import ConveyorMiddleware
from conveyor.redaction import payload_secrets, scrub, settings_secrets

if TYPE_CHECKING:
    from conveyor.middleware.metrics import Metrics
    from conveyor.settings import Settings

#: Seconds a stopping worker gives pending alerts before counting them lost.
SHUTDOWN_FLUSH_SECONDS = 10.0


class PayloadModelOf(Protocol):
    """What the webhook needs of a job type (``conveyor.blueprints.JobType``): its payload model,
    which says which fields are secret."""

    @property
    def payload(self) -> type: ...


class FailureWebhook(ConveyorMiddleware):
    """Posts one alert per dead job (``after_job_dead``, which conveyor calls once per job)."""

    def __init__(
        self,
        settings: "Settings",
        job_types: Mapping[str, PayloadModelOf],
        metrics: "Metrics | None" = None,
        *,
        secrets: Sequence[str] | None = None,
    ) -> None:
        self.settings = settings
        #: Secret values of every settings object of the App (a blueprint's too); default: ``settings``' own.
        self.secrets = list(settings_secrets(settings) if secrets is None else secrets)
        self.job_types = job_types
        self.metrics = metrics
        url = settings.job_failure_webhook_url.get_secret_value() if settings.job_failure_webhook_url else ""
        self.sender = None
        if url:
            self.sender = WebhookSender(
                url,
                settings.webhook_format or guess_format(url),
                timeout=settings.webhook_timeout,
                attempts=settings.webhook_attempts,
                backoff=settings.webhook_backoff,
                queue_size=settings.webhook_queue_size,
                on_outcome=self._outcome,
            )

    def after_job_dead(self, broker: ConveyorBroker, message: AnyMessage, error: str) -> None:
        if self.sender is None:
            return
        self.sender.submit(self.alert(message, error))

    def alert(self, message: AnyMessage, error: str) -> Alert:
        """The alert for a dead job: metadata only, its error scrubbed of every secret value."""
        job_type = self.job_types.get(message.actor_name)
        payload = message.args[0] if message.args else None
        secrets = [*self.secrets, *payload_secrets(payload, job_type.payload if job_type else None)]
        base = (self.settings.public_url or "").rstrip("/")
        return Alert(
            job=message.actor_name,
            queue=q_name(message.queue_name),
            job_id=message.message_id,
            attempts=message.options.get("attempt"),
            error=scrub(error, secrets) or "",
            failed_at=time.time(),
            link=f"{base}/admin/jobs/{message.message_id}" if base else None,
        )

    def after_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        if self.sender is not None:
            self.sender.flush(SHUTDOWN_FLUSH_SECONDS)

    def _outcome(self, alert: Alert, delivered: bool, reason: str | None) -> None:
        if self.metrics is None:
            return
        if delivered:
            self.metrics.webhook_delivered(alert.queue, alert.job)
        else:
            self.metrics.webhook_lost(alert.queue, alert.job, reason or "gave_up")

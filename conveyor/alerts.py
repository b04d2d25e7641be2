"""Failure alerts to chat: the message bodies, and a sender that never holds up a worker.

:func:`render` builds the body for Slack (``text`` plus Block Kit
``blocks``; Mattermost and Rocket.Chat take the same), Discord
(``content``) or any other receiver (generic JSON with the job's
metadata). An alert never carries the payload, and its error text is
scrubbed of secrets before it gets here. Error text is a stranger's text
(a processor may put any input into its exception): in chat formats it is
escaped so it can neither mention anyone (``@everyone``, Slack's
``<!channel>``; Discord bodies also say ``allowed_mentions: none``) nor
leave its code block.

:class:`WebhookSender` posts from one background thread fed by a bounded
queue: a worker hands an alert over and goes on. Each alert is tried
``attempts`` times with exponential backoff and a timeout per POST; an
alert that cannot be delivered, or that finds the queue full, is lost,
counted and logged, never raised.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Callable, Literal
from urllib.parse import urlsplit

from conveyor.logs import log_event

if TYPE_CHECKING:
    import httpx

Format = Literal["slack", "discord", "generic"]

#: Longest error text put in an alert; Discord refuses content over 2000 characters.
MAX_ERROR_CHARS = 1500

#: Receiver answers worth another try: timeouts, rate limits, server errors.
RETRY_STATUSES = frozenset({408, 425, 429}) | frozenset(range(500, 600))


@dataclass(frozen=True)
class Alert:
    """One job that has spent its retries, as an alert tells it."""

    job: str
    queue: str
    job_id: str
    attempts: int | None
    error: str
    failed_at: float
    link: str | None = None


def guess_format(url: str) -> Format:
    """The body format a webhook URL expects: Slack's and Discord's hosts are recognised."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if host.endswith("slack.com"):
        return "slack"
    if host.endswith(("discord.com", "discordapp.com")) and "/api/webhooks/" in parts.path:
        return "discord"
    return "generic"


#: Stands in for a backtick inside a code block: it looks alike and cannot close the block.
_BACKTICK_STAND_IN = "\u02cb"

#: Discord: mention nobody, whatever the text says.
NO_MENTIONS: dict[str, list[str]] = {"parse": []}


def _defuse_mentions(text: str) -> str:
    # A zero-width space after '@' keeps the text readable and makes it no mention.
    return text.replace("@everyone", "@\u200beveryone").replace("@here", "@\u200bhere")


def slack_text(text: str) -> str:
    """Text safe in Slack mrkdwn: no control sequences (``<!everyone>``, ``<@U1>``, links), no @-mentions."""
    return _defuse_mentions(text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))


def code_block_text(text: str) -> str:
    """Text that stays inside a ``` code block."""
    return text.replace("`", _BACKTICK_STAND_IN)


def discord_text(text: str) -> str:
    """Text safe in Discord markdown outside a code block: no mentions (allowed_mentions says so too)."""
    return _defuse_mentions(text).replace("<@", "<\u200b@")


def render(alert: Alert, fmt: Format) -> dict[str, Any]:
    """The JSON body of ``alert`` in format ``fmt``."""
    error = alert.error if len(alert.error) <= MAX_ERROR_CHARS else alert.error[:MAX_ERROR_CHARS] + "…"
    if fmt != "generic":
        error = code_block_text(error)
    attempts = f"after {alert.attempts} attempt{'s' if alert.attempts != 1 else ''}" if alert.attempts else ""
    when = datetime.fromtimestamp(alert.failed_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    summary = f"Job {alert.job} ({alert.job_id}) on queue {alert.queue} failed for good {attempts}".rstrip()
    if fmt == "slack":
        error, job_id = slack_text(error), code_block_text(slack_text(alert.job_id))
        summary = slack_text(summary)
        blocks: list[dict[str, Any]] = [
            {"type": "header", "text": {"type": "plain_text", "text": f"Job failed: {alert.job}"[:150]}},
            {
                "type": "section",
                "fields": [
                    {"type": "mrkdwn", "text": f"*Queue*\n{slack_text(alert.queue)}"},
                    {"type": "mrkdwn", "text": f"*Job id*\n`{job_id}`"},
                    {"type": "mrkdwn", "text": f"*Attempts*\n{alert.attempts or '-'}"},
                    {"type": "mrkdwn", "text": f"*Failed at*\n{when}"},
                ],
            },
            {"type": "section", "text": {"type": "mrkdwn", "text": f"```{error}```"}},
        ]
        if alert.link:
            blocks.append(
                {
                    "type": "actions",
                    "elements": [
                        {
                            "type": "button",
                            "text": {"type": "plain_text", "text": "Open in dashboard"},
                            "url": alert.link,
                        }
                    ],
                }
            )
        return {"text": f"{summary}: {error}", "blocks": blocks}
    if fmt == "discord":
        lines = [f"**{discord_text(summary)}**", f"```{discord_text(error)}```"]
        if alert.link:
            lines.append(alert.link)
        return {"content": "\n".join(lines)[:2000], "allowed_mentions": NO_MENTIONS}
    body = {"event": "job.dead", "text": summary, **asdict(alert)}
    body["error"] = error
    body["failed_at"] = datetime.fromtimestamp(alert.failed_at, UTC).isoformat()
    return body


def describe_url(url: str) -> str:
    """Scheme and host of a webhook URL, for logs: the path of a chat webhook is its secret."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}"


class WebhookSender:
    """Posts alerts from a background thread; :meth:`submit` never blocks and never raises.

    ``on_outcome(alert, delivered, reason)`` is called once per alert:
    ``reason`` is ``None`` when delivered, else ``"gave_up"``, ``"queue_full"``
    or ``"shutdown"``.
    """

    def __init__(
        self,
        url: str,
        fmt: Format,
        *,
        timeout: float,
        attempts: int,
        backoff: float,
        queue_size: int,
        on_outcome: Callable[[Alert, bool, str | None], None],
    ) -> None:
        self._url = url
        self.fmt = fmt
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff
        self.on_outcome = on_outcome
        self._queue: queue.Queue[Alert] = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._idle = threading.Condition()
        self._busy = 0
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def submit(self, alert: Alert) -> None:
        """Hand an alert to the sender thread (started on first use)."""
        self._ensure_thread()
        with self._idle:
            try:
                self._queue.put_nowait(alert)
                self._busy += 1
                return
            except queue.Full:
                pass
        self._lost(alert, "queue_full", f"{self._queue.maxsize} alerts were already waiting")

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every submitted alert was delivered or given up."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self, timeout: float = 0) -> None:
        """Give pending alerts ``timeout`` seconds, then stop; what is left is counted as lost."""
        self.flush(timeout)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 1)

    def _ensure_thread(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="conveyor-webhook", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        try:
            # Imported by the sender thread, on the first alert: httpx (with click, rich and pygments,
            # which its command line pulls in) costs a worker ~8 MiB it would hold for an alert never sent.
            import httpx

            client = httpx.Client(timeout=self.timeout, follow_redirects=False)
        except Exception as exc:  # no client: what waits is lost, counted; the next alert tries again
            with self._start_lock:
                self._thread = None
            self._lose_waiting(f"{type(exc).__name__}: the webhook client could not be made")
            return
        with client:
            while True:
                try:
                    alert = self._queue.get(timeout=0.2)
                except queue.Empty:
                    if self._stop.is_set():
                        return
                    continue
                try:
                    if self._stop.is_set():
                        self._lost(alert, "shutdown", "the worker stopped before the alert was sent")
                    else:
                        self._deliver(client, alert)
                except Exception as exc:  # never let one alert end the thread
                    self._lost(alert, "gave_up", f"{type(exc).__name__}: {exc}")
                finally:
                    with self._idle:
                        self._busy -= 1
                        self._idle.notify_all()

    def _lose_waiting(self, why: str) -> None:
        while True:
            try:
                alert = self._queue.get_nowait()
            except queue.Empty:
                return
            try:
                self._lost(alert, "gave_up", why)
            finally:
                with self._idle:
                    self._busy -= 1
                    self._idle.notify_all()

    def _deliver(self, client: httpx.Client, alert: Alert) -> None:
        body = render(alert, self.fmt)
        import httpx

        problem = ""
        for attempt in range(1, self.attempts + 1):
            try:
                response = client.post(self._url, json=body)
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}"  # the message may quote the URL: keep the type only
            else:
                if response.is_success:
                    self.on_outcome(alert, True, None)
                    log_event(
                        "webhook_delivered",
                        queue=alert.queue,
                        job=alert.job,
                        job_id=alert.job_id,
                        attempt=alert.attempts,
                        receiver=describe_url(self._url),
                        tries=attempt,
                    )
                    return
                problem = f"HTTP {response.status_code}"
                if response.status_code not in RETRY_STATUSES:
                    break  # the receiver refuses this body: another try would be refused too
            if attempt < self.attempts and self._stop.wait(self.backoff * 2 ** (attempt - 1)):
                break
        self._lost(alert, "gave_up", f"{problem} after {attempt} tr{'y' if attempt == 1 else 'ies'}")

    def _lost(self, alert: Alert, reason: str, why: str) -> None:
        try:
            self.on_outcome(alert, False, reason)
        finally:
            log_event(
                "webhook_lost",
                level="error",
                queue=alert.queue,
                job=alert.job,
                job_id=alert.job_id,
                attempt=alert.attempts,
                receiver=describe_url(self._url),
                reason=reason,
                error=why,
            )

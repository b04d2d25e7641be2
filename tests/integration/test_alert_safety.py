"""Failure alerts are safe to post and safe to log: a real alert to a real local HTTP receiver.

An error text is whatever a processor put in its exception, so it may try to
ping everyone or leave its code block; and the webhook URL is a secret that
no log line may carry, httpx's own included.
"""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest

from conveyor.alerts import Alert, WebhookSender
from conveyor.logs import configure_logging
from tests.support.obs_support import Receiver

HOSTILE = "boom @everyone @here <!channel> <!everyone> <@U0123> ``` now outside the block *bold* <https://evil|x>"


@pytest.fixture
def receiver():
    r = Receiver("ok")
    yield r
    r.close()


def _send(url: str, fmt: str, error: str = HOSTILE) -> None:
    outcomes = []
    done = threading.Event()

    def on_outcome(alert, ok, reason):
        outcomes.append((ok, reason))
        done.set()

    sender = WebhookSender(url, fmt, timeout=5, attempts=1, backoff=0, queue_size=10, on_outcome=on_outcome)
    try:
        sender.submit(
            Alert(
                job="obs.work",
                queue="indexing",
                job_id="j-1",
                attempts=3,
                error=error,
                failed_at=1_700_000_000.0,
                link="https://conveyor.example.com/admin/jobs/j-1",
            )
        )
        assert done.wait(10) and outcomes == [(True, None)]
    finally:
        sender.close(5)


def test_a_discord_alert_mentions_nobody_and_keeps_the_error_in_its_code_block(receiver):
    _send(receiver.url, "discord")
    body = receiver.bodies()[0]
    assert body["allowed_mentions"] == {"parse": []}
    content = body["content"]
    assert content.count("```") == 2, content  # the block opens and closes once: the text cannot leave it
    assert "@everyone" not in content and "@here" not in content and "<@U0123>" not in content
    assert "boom" in content and "now outside the block" in content  # still readable


def test_a_slack_alert_carries_no_control_sequence_or_mention(receiver):
    _send(receiver.url, "slack")
    body = receiver.bodies()[0]
    texts = [body["text"]] + [json.dumps(block) for block in body["blocks"]]
    for text in texts:
        assert "<!channel>" not in text and "<!everyone>" not in text and "<@U0123>" not in text
        assert "<https://evil|x>" not in text and "@everyone" not in text
    error_block = body["blocks"][2]["text"]["text"]
    assert error_block.startswith("```") and error_block.endswith("```") and error_block.count("```") == 2
    assert "&lt;!channel&gt;" in error_block


def test_no_log_line_of_a_real_alert_names_the_webhook_url(receiver):
    """httpx logs every request's URL at INFO: the webhook path is the secret and must not reach the log."""
    stream = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level, {n: logging.getLogger(n).level for n in ("httpx", "httpcore")}
    configure_logging("DEBUG", stream=stream, secrets=[receiver.url])
    try:
        _send(receiver.url, "generic", error="plain failure")
        # A third-party line that does get through (a warning, say) is scrubbed too.
        logging.getLogger("httpx").warning("retrying POST %s", receiver.url)
    finally:
        root.handlers[:], level, levels = saved
        root.setLevel(level)
        for name, lvl in levels.items():
            logging.getLogger(name).setLevel(lvl)
    text = stream.getvalue()
    assert receiver.count() == 1
    assert '"event":"webhook_delivered"' in text  # conveyor's own line was written
    secret_path = receiver.url.split("://", 1)[1].split("/", 1)[1]
    assert secret_path not in text and receiver.url not in text, text
    assert "retrying POST [redacted]" in text


def test_a_logged_traceback_is_scrubbed_too():
    stream = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    secret = "https://hooks.example.com/services/T1/B2/very-secret-path"
    configure_logging("INFO", stream=stream, secrets=[secret])
    try:
        try:
            raise RuntimeError(f"could not post to {secret}")
        except RuntimeError:
            logging.getLogger("urllib3.connectionpool").error("request failed", exc_info=True)
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    line = json.loads(stream.getvalue().strip().splitlines()[-1])
    assert "RuntimeError" in line["exc"] and "very-secret-path" not in stream.getvalue()


def test_a_sender_whose_http_client_cannot_be_made_counts_the_alert_lost_and_tries_again(receiver, monkeypatch):
    """The sender thread builds its HTTP client on the first alert: if that fails, the alert waiting is
    counted lost (never left waiting, so a flush does not hang), and the next alert starts a new thread."""
    import httpx

    outcomes = []
    seen = threading.Semaphore(0)

    def on_outcome(alert, ok, reason):
        outcomes.append((alert.job_id, ok, reason))
        seen.release()

    real_client = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda *a, **k: (_ for _ in ()).throw(OSError("no sockets left")))
    sender = WebhookSender(receiver.url, "json", timeout=5, attempts=1, backoff=0, queue_size=10, on_outcome=on_outcome)
    alert = Alert(job="obs.work", queue="indexing", job_id="j-1", attempts=3, error="x", failed_at=1.0, link=None)
    try:
        sender.submit(alert)
        assert seen.acquire(timeout=10)
        assert outcomes == [("j-1", False, "gave_up")]
        assert sender.flush(5), "the lost alert was left counted as waiting"
        monkeypatch.setattr(httpx, "Client", real_client)
        sender.submit(Alert(**{**alert.__dict__, "job_id": "j-2"}))
        assert seen.acquire(timeout=10)
        assert outcomes[-1] == ("j-2", True, None)
    finally:
        sender.close(5)

"""Failure alert bodies: each format's shape, rendered from an Alert without sending it."""

from __future__ import annotations

from conveyor.alerts import Alert, guess_format, render

ALERT = Alert(
    job="obs.work",
    queue="indexing",
    job_id="abc-123",
    attempts=3,
    error="JobError: boom",
    failed_at=1_700_000_000.0,
    link="https://conveyor.example.com/admin/jobs/abc-123",
)


def test_the_format_is_guessed_from_the_url():
    assert guess_format("https://hooks.slack.com/services/T0/B0/xyz") == "slack"
    assert guess_format("https://discord.com/api/webhooks/1/abc") == "discord"
    assert guess_format("https://discordapp.com/api/webhooks/1/abc") == "discord"
    assert guess_format("https://alerts.example.com/conveyor") == "generic"


def test_slack_body_has_text_and_blocks_with_the_dashboard_link():
    body = render(ALERT, "slack")
    assert "obs.work" in body["text"] and "abc-123" in body["text"] and "boom" in body["text"]
    kinds = [b["type"] for b in body["blocks"]]
    assert kinds[0] == "header" and "actions" in kinds
    assert body["blocks"][-1]["elements"][0]["url"] == ALERT.link


def test_discord_body_is_content_within_its_limit():
    body = render(Alert(**{**ALERT.__dict__, "error": "x" * 5000}), "discord")
    assert (
        set(body) == {"content", "allowed_mentions"} and len(body["content"]) <= 2000 and ALERT.link in body["content"]
    )


def test_generic_body_carries_the_jobs_metadata():
    body = render(ALERT, "generic")
    assert body["event"] == "job.dead"
    assert {k: body[k] for k in ("job", "queue", "job_id", "attempts", "link")} == {
        "job": "obs.work",
        "queue": "indexing",
        "job_id": "abc-123",
        "attempts": 3,
        "link": ALERT.link,
    }
    assert body["failed_at"].startswith("2023-11-14T22:13:20")

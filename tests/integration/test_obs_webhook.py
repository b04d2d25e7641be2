"""Failure alerts: once per job, and receivers that are down, slow or failing (their bodies: tests/unit/test_alert_bodies.py)."""

from __future__ import annotations

import json
import logging
import time

import pytest

from tests.support.obs_support import SECRET, Receiver, redis_app, registry_text, value, worker
from tests.support.servers import free_port
from tests.support.waiting import wait_for

QUEUE = "indexing"


@pytest.fixture
def receiver():
    r = Receiver("ok")
    yield r
    r.close()


def webhook_app(redis_url, url, **overrides):
    options = dict(
        job_failure_webhook_url=url,
        webhook_timeout=0.3,
        webhook_attempts=3,
        webhook_backoff=0.05,
        public_url="https://conveyor.example.com/",
    )
    options.update(overrides)
    return redis_app(redis_url, **options)


def lost(app, reason=None) -> float:
    labels = {"reason": reason} if reason else {}
    return value(registry_text(app), "conveyor_webhook_failures_total", **labels)


def delivered(app) -> float:
    return value(registry_text(app), "conveyor_webhook_deliveries_total")


def webhook_events(caplog, event: str) -> list[dict]:
    return [
        json.loads(r.getMessage())
        for r in caplog.records
        if r.name == "conveyor.events" and json.loads(r.getMessage())["event"] == event
    ]


# -- delivery -------------------------------------------------------------------------


def test_one_alert_per_dead_job_not_per_attempt(redis_url, receiver):
    app = webhook_app(redis_url, receiver.url, webhook_format="generic")
    try:
        with worker(app, QUEUE):
            first = app.jobs.enqueue("obs.work", {"n": 1, "fail": True, "api_key": SECRET})
            wait_for(lambda: receiver.count() == 1, message="the first alert")
            recovered = app.jobs.enqueue("obs.work", {"n": 2, "fail_first": 2})  # fails twice, then completes
            second = app.jobs.enqueue("obs.work", {"n": 3, "fail": True})
            wait_for(lambda: receiver.count() == 2, message="the second alert")
            wait_for(lambda: app.broker.get_job(recovered.id).state == "completed", message="the recovered job")
            wait_for(lambda: delivered(app) == 2, message="two deliveries counted")
    finally:
        app.close()
    bodies = receiver.bodies()
    assert [b["job_id"] for b in bodies] == [first.id, second.id]
    assert bodies[0]["attempts"] == 3 and bodies[0]["queue"] == QUEUE
    assert bodies[0]["link"] == f"https://conveyor.example.com/admin/jobs/{first.id}"
    assert receiver.requests[0]["content_type"] == "application/json"
    assert all(SECRET not in r["body"] for r in receiver.requests)
    assert value(registry_text(app), "conveyor_jobs_dead_total", queue=QUEUE) == 2


def test_a_receiver_that_is_down_is_retried_then_given_up_and_workers_go_on(redis_url, caplog):
    down = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    app = webhook_app(redis_url, down)
    caplog.set_level(logging.INFO, logger="conveyor.events")
    try:
        with worker(app, QUEUE):
            dead = app.jobs.enqueue("obs.work", {"n": 1, "fail": True})
            ok = [app.jobs.enqueue("obs.work", {"n": 10 + n}) for n in range(10)]
            wait_for(lambda: all(app.broker.get_job(r.id).state == "completed" for r in ok), message="other jobs")
            wait_for(lambda: lost(app, "gave_up") == 1, message="the alert to be given up")
            assert app.broker.get_job(dead.id).state == "failed"
            after = app.jobs.enqueue("obs.work", {"n": 99})
            wait_for(lambda: app.broker.get_job(after.id).state == "completed", message="a job after the loss")
    finally:
        app.close()
    [event] = webhook_events(caplog, "webhook_lost")
    assert event["job_id"] == dead.id and event["reason"] == "gave_up" and "3 tries" in event["error"]
    assert event["receiver"] == "http://127.0.0.1"  # the URL's path (a chat webhook's secret) is never logged
    assert "/hook" not in caplog.text
    assert delivered(app) == 0


@pytest.mark.parametrize("mode,posts,why", [("error", 3, "HTTP 500"), ("refuse", 1, "HTTP 400")])
def test_a_receiver_answering_an_error_is_retried_only_when_it_may_help(redis_url, caplog, mode, posts, why):
    """500: every attempt, then given up. 400: the body is refused, another try would be too."""
    failing = Receiver(mode)
    app = webhook_app(redis_url, failing.url)
    caplog.set_level(logging.INFO, logger="conveyor.events")
    try:
        with worker(app, QUEUE):
            app.jobs.enqueue("obs.work", {"n": 1, "fail": True})
            wait_for(lambda: lost(app, "gave_up") == 1, message="the alert to be given up")
    finally:
        app.close()
        failing.close()
    assert failing.count() == posts
    [event] = webhook_events(caplog, "webhook_lost")
    assert why in event["error"]


def test_a_slow_receiver_never_holds_up_workers_and_excess_alerts_are_dropped(redis_url, caplog):
    slow = Receiver("slow", delay=2.0)  # far beyond the 0.3 s timeout
    app = webhook_app(redis_url, slow.url, webhook_attempts=2, webhook_queue_size=1)
    caplog.set_level(logging.INFO, logger="conveyor.events")
    try:
        with worker(app, QUEUE):
            dead = [app.jobs.enqueue("obs.work", {"n": n, "fail": True}) for n in range(3)]
            wait_for(lambda: all(app.broker.get_job(r.id).state == "failed" for r in dead), message="3 dead jobs")
            started = time.monotonic()
            ok = [app.jobs.enqueue("obs.work", {"n": 10 + n}) for n in range(20)]
            wait_for(lambda: all(app.broker.get_job(r.id).state == "completed" for r in ok), message="20 jobs")
            took = time.monotonic() - started
            wait_for(lambda: lost(app) == 3, timeout=30, message="all three alerts lost")
    finally:
        app.close()
        slow.close()
    # 20 jobs ran while the sender was stuck on timeouts (2 x 0.3 s per alert plus backoff).
    assert took < 5, took
    assert lost(app, "queue_full") >= 1 and lost(app, "gave_up") >= 1
    reasons = sorted(e["reason"] for e in webhook_events(caplog, "webhook_lost"))
    assert len(reasons) == 3 and "queue_full" in reasons

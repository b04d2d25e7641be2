"""wait_and_resume and nudges: delayed jobs that check the current state by id before they act."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

import pytest

from conveyor.errors import InvalidSchedule, ScheduleError
from conveyor.platform.scheduling.nudges import (
    cancel_nudge,
    get_nudge,
    note_task_closed,
    note_user_reply,
    schedule_nudge,
)
from conveyor.platform.scheduling.pauses import cancel_run, get_pause, pause_run
from tests.support.harness import running
from tests.support.sched_jobs import any_broker_app, runs  # noqa: F401 (fixture)
from tests.support.waiting import wait_for

#: A task, its user message and a queued run, in the agent platform's tables.
PLATFORM_RUN = """
INSERT INTO tasks (id, user_id) VALUES ('task-p', 'u1');
INSERT INTO messages (id, task_id, role, content) VALUES ('m-p', 'task-p', 'user', 'go');
INSERT INTO runs (id, task_id, job, user_message_id, assistant_message_id)
VALUES ('run-p', 'task-p', 'task.run', 'm-p', 'am-p');
"""


def pause_status(app, pause_id: str) -> str | None:
    with app.pool.connection() as conn:
        pause = get_pause(conn, pause_id)
    return pause.status if pause else None


@pytest.fixture
def app(any_broker_app):
    return any_broker_app


@pytest.fixture
def events(caplog):
    """conveyor's event lines, parsed: events("skipped") -> [dict, ...]."""
    caplog.set_level(logging.INFO, logger="conveyor.events")

    def named(name: str) -> list[dict]:
        parsed = [json.loads(r.getMessage()) for r in caplog.records if r.name == "conveyor.events"]
        return [e for e in parsed if e["event"] == name]

    return named


def test_a_paused_run_resumes_after_its_delay_unless_cancelled(app, events):
    kept = pause_run(
        app,
        run_id="run-1",
        task_id="task-1",
        delay=0.3,
        reason="waiting for a webhook",
        resume_job="test.record",
        resume_payload={"note": "resume-run-1"},
    )
    dropped = pause_run(
        app, run_id="run-2", delay=0.3, resume_job="test.record", resume_payload={"note": "resume-run-2"}
    )
    with pytest.raises(ScheduleError, match="run-1 is already paused"):
        pause_run(app, run_id="run-1", delay=1, resume_job="test.record", resume_payload={"note": "x"})
    with pytest.raises(InvalidSchedule, match="note"):
        pause_run(app, run_id="run-3", delay=1, resume_job="test.record", resume_payload={"note": ""})
    assert app.broker.queue_counts("scheduling").delayed == 2

    # A pause longer than the broker's delay window: its job wakes early and defers itself again.
    long = pause_run(app, run_id="run-4", delay=0, resume_job="test.record", resume_payload={"note": "later"})
    with app.pool.connection() as conn:
        conn.execute("UPDATE run_pauses SET resume_at = now() + interval '30 days' WHERE id = %s", (long.id,))

    # A run of the platform's (table runs), cancelled there rather than through cancel_run.
    with app.pool.connection() as conn:
        conn.execute(PLATFORM_RUN)
    platform = pause_run(app, run_id="run-p", delay=0.3, resume_job="test.record", resume_payload={"note": "p"})
    with app.pool.connection() as conn:
        conn.execute("UPDATE runs SET status = 'cancelled', finished_at = now() WHERE id = 'run-p'")

    with app.pool.connection() as conn:
        assert cancel_run(conn, "run-2") == [dropped.id]
    with running(app, "scheduling", "indexing"):
        wait_for(
            lambda: (
                runs(app) == [{"note": "resume-run-1"}]
                and app.broker.get_job(dropped.job_id).state == "completed"
                and app.broker.get_job(long.job_id).state == "delayed"
                and app.broker.get_job(platform.job_id).state == "completed"
            ),
            timeout=20,
            message="run-1 resumed, run-2's resume handled, run-4's deferred",
        )
    assert pause_status(app, long.id) == "waiting"
    deferred = app.broker.get_job(long.job_id)
    assert deferred.eta - deferred.enqueued_at > 6 * 24 * 3600  # one 7-day hop (the broker's limit), not 30 days
    assert pause_status(app, kept.id) == "resumed"
    assert pause_status(app, dropped.id) == "cancelled"
    skips = {e["run_id"]: (e["job_id"], e["reason"]) for e in events("skipped")}
    assert skips == {
        "run-2": (dropped.job_id, "the run was cancelled"),
        "run-p": (platform.job_id, "the run was cancelled"),
    }
    assert pause_status(app, platform.id) == "cancelled"
    # Too late to cancel a resumed run's resume; it can be paused again.
    with app.pool.connection() as conn:
        assert cancel_run(conn, "run-1") == []
    pause_run(app, run_id="run-1", delay=60, resume_job="test.record", resume_payload={"note": "again"})


def test_a_superseded_nudge_is_skipped_with_its_reason(app, events):
    at = datetime.now(UTC) + timedelta(seconds=0.2)
    sent = schedule_nudge(app, task_id="t-quiet", at=at, job="test.record", payload={"note": "nudge-quiet"})
    replied = schedule_nudge(app, task_id="t-replied", at=at, job="test.record", payload={"note": "nudge-replied"})
    closed = schedule_nudge(app, task_id="t-closed", at=at, job="test.record", payload={"note": "nudge-closed"})
    cancelled = schedule_nudge(app, task_id="t-cancel", at=at, job="test.record", payload={"note": "nudge-cancel"})
    # Idempotent: the same nudge set twice is one nudge and one job.
    again = schedule_nudge(app, task_id="t-quiet", at=at, job="test.record", payload={"note": "nudge-quiet"})
    assert (again.id, again.job_id, again.created) == (sent.id, sent.job_id, False)
    assert app.broker.queue_counts("nudge").delayed == 4

    # The platform's task, where the user writes a message after the nudge was set.
    with app.pool.connection() as conn:
        conn.execute("INSERT INTO tasks (id, user_id) VALUES ('t-platform', 'u1')")
    platform = schedule_nudge(app, task_id="t-platform", at=at, job="test.record", payload={"note": "nudge-p"})
    with app.pool.connection() as conn:
        conn.execute("INSERT INTO messages (id, task_id, role, content) VALUES ('m-1', 't-platform', 'user', 'hi')")
    with app.pool.connection() as conn:
        note_user_reply(conn, "t-replied")
        note_task_closed(conn, "t-closed")
        note_user_reply(conn, "t-quiet", at=datetime.now(UTC) - timedelta(hours=1))  # before the nudge was set
        assert cancel_nudge(conn, cancelled.id)
    with running(app, "nudge", "indexing"):
        wait_for(
            lambda: runs(app) == [{"note": "nudge-quiet"}] and len(events("skipped")) == 4,
            timeout=20,
            message="nudges resolved",
        )
        # A second delivery of a nudge already sent does nothing.
        app.jobs.enqueue("nudge.fire", {"nudge_id": sent.id})
        wait_for(lambda: len(events("skipped")) == 5, timeout=20, message="duplicate nudge skipped")
    assert runs(app) == [{"note": "nudge-quiet"}]
    with app.pool.connection() as conn:
        states = {
            n.id: (record.status, record.skip_reason)
            for n in (sent, replied, closed, cancelled, platform)
            for record in [get_nudge(conn, n.id)]
            if record is not None
        }
    assert states == {
        sent.id: ("sent", None),
        replied.id: ("skipped", "user_replied"),
        closed.id: ("skipped", "task_closed"),
        cancelled.id: ("cancelled", None),
        platform.id: ("skipped", "user_replied"),
    }
    reasons = {(e.get("task_id"), e["reason"]) for e in events("skipped")}
    assert reasons == {
        ("t-replied", "user_replied"),
        ("t-closed", "task_closed"),
        ("t-platform", "user_replied"),
        ("t-cancel", "nudge already cancelled"),
        ("t-quiet", "nudge already sent"),
    }
    with app.pool.connection() as conn:
        assert not cancel_nudge(conn, sent.id)

"""POST /api/runs/{run_id}/cancel: the user presses Stop (issue 21 item 1), on Redis and Postgres.

A running run stops where it runs, keeps the reply streamed so far, and its stream ends
``cancelled``; a queued run never starts; only the run's owner may cancel it (404 for anyone else,
as for an unknown id); an ended run answers 409.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from conveyor.app import App
from conveyor.platform.settings import PlatformSettings
from conveyor.settings import Settings
from tests.support.brokers import SERVER_BROKERS
from tests.support.platform_support import make_task, parse_sse, run_status, serve, user_key, workers
from tests.support.waiting import wait_for


@pytest.fixture(params=SERVER_BROKERS)
def app(request, redis_url, database_url):
    app = App(
        Settings(
            broker=request.param,
            redis_url=redis_url,
            database_url=database_url,
            cancel_grace_seconds=1,
        ),
        blueprint_settings=[PlatformSettings(local_chunk_delay=0.3)],
    )
    yield app
    app.close()


def test_stop_a_running_run_keeps_its_partial_reply_and_ends_its_stream_cancelled(app):
    make_task(app, "t1", user_id="alice")
    make_task(app, "t2", user_id="bob")
    with (
        workers(app),
        serve(app) as base,
        httpx.Client(base_url=base, timeout=30, headers=user_key(app, "alice")) as alice,
        httpx.Client(base_url=base, timeout=30, headers=user_key(app, "bob")) as bob,
    ):
        accepted = alice.post("/api/tasks/t1/runs", json={"content": "one two three four five six seven"}).json()
        run_id = accepted["run_id"]
        events: list[dict] = []
        asked = 0.0
        with alice.stream("GET", accepted["stream_url"]) as response:
            for event in parse_sse(response.iter_lines()):
                if "id" not in event:
                    continue
                events.append(event)
                if len(events) == 2:
                    assert bob.post(f"/api/runs/{run_id}/cancel").status_code == 404, "not bob's run"
                    asked = time.monotonic()
                    stopped = alice.post(f"/api/runs/{run_id}/cancel")
                    assert stopped.status_code == 200, stopped.text
                if event["event"] == "end":
                    break
        ended_after = time.monotonic() - asked
        print(f"\n[{app.settings.broker_name}] run stopped: stream ended {ended_after * 1000:.0f} ms after the cancel")
        assert events[-1]["event"] == "end" and json.loads(events[-1]["data"]) == {"status": "cancelled"}
        assert ended_after < 2.0
        chunks = [json.loads(e["data"])["text"] for e in events if e["event"] == "chunk"]
        assert chunks, "the partial reply streamed before the stop"
        run = run_status(app, run_id)
        assert run.status == "cancelled"
        with app.pool.connection() as conn:
            (content,) = conn.execute(
                "SELECT content FROM messages WHERE id = %s", (accepted["assistant_message_id"],)
            ).fetchone()
        assert content == "".join(chunks), "the partial reply is kept, exactly as streamed"
        assert alice.post(f"/api/runs/{run_id}/cancel").status_code == 409
        assert alice.post("/api/runs/no-such-run/cancel").status_code == 404
        wait_for(
            lambda: app.broker.get_job(accepted["job_id"]).state == "cancelled", timeout=10, message="job cancelled"
        )


def test_stop_a_queued_run_it_never_starts(app):
    make_task(app, "t1", user_id="alice")
    with serve(app) as base, httpx.Client(base_url=base, timeout=30, headers=user_key(app, "alice")) as alice:
        accepted = alice.post("/api/tasks/t1/runs", json={"content": "hello"}).json()
        stopped = alice.post(f"/api/runs/{accepted['run_id']}/cancel")
        assert stopped.status_code == 200 and stopped.json()["status"] == "cancelled"
        assert app.broker.get_job(accepted["job_id"]).state == "cancelled"
        with alice.stream("GET", accepted["stream_url"]) as response:
            events = [e for e in parse_sse(response.iter_lines()) if "id" in e]
        assert events[-1]["event"] == "end" and json.loads(events[-1]["data"]) == {"status": "cancelled"}
    with workers(app):
        time.sleep(1.0)
    assert run_status(app, accepted["run_id"]).status == "cancelled"
    assert app.broker.get_job(accepted["job_id"]).attempts == 0

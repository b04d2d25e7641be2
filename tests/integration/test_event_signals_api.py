"""Signalling an event over HTTP (``POST /api/events/{name}``) and from the shell (``conveyor signal``).

The admin token signals any event; a user's key only events named ``user:<its user id>:...``;
bad names answer 4xx without echoing them. A job waiting for the event resumes with the data.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import psycopg
import pytest

from conveyor.app import App
from tests.support import wait_jobs
from tests.support.harness import env_for, make_settings
from tests.support.obs_support import TOKEN
from tests.support.platform_support import serve, user_key
from tests.support.waiting import wait_for

ADMIN = {"Authorization": f"Bearer {TOKEN}"}
HOSTILE = "<script>alert(1)</script>"


@pytest.fixture
def settings(clean_env, redis_url, database_url):
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(wait_jobs.TABLE)
    return make_settings("redis", redis_url, database_url, imports="tests.support.wait_jobs", admin_token=TOKEN)


def _resumed_with(app: App, job_id: str, database_url: str) -> object:
    wait_for(lambda: app.jobs.get(job_id).state == "completed", timeout=30, message="the job to complete")
    with psycopg.connect(database_url) as conn:
        (data,) = conn.execute(
            "SELECT data FROM wait_runs WHERE job_id = %s AND phase = 'resumed'", (job_id,)
        ).fetchone()
    return json.loads(data)


def test_the_http_route_signals_with_the_admin_token_or_a_users_own_key(app, workers, database_url):
    workers("waits")
    ref = app.jobs.enqueue("test.wait.waiter", {"token": "http", "event": "approval:http-1"})
    wait_for(lambda: app.jobs.get(ref.id).state == "awaiting", timeout=30)
    alice = user_key(app, "alice")
    with serve(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        assert client.post("/api/events/approval:http-1", json={"data": 1}).status_code == 401
        refused = client.post("/api/events/approval:http-1", json={"data": 1}, headers=alice)
        assert refused.status_code == 403, "a user's key signals only events under user:<id>:"
        assert app.jobs.get(ref.id).state == "awaiting"
        # The admin API and the dashboard show the job awaiting its event.
        job = client.get(f"/api/admin/jobs/{ref.id}", headers=ADMIN).json()
        assert (job["state"], job["event"]) == ("awaiting", "approval:http-1")
        assert client.get("/api/admin/queue-metrics", headers=ADMIN).json()["waits"]["awaiting"] == 1
        listed = client.get("/api/admin/jobs?queue=waits&state=awaiting", headers=ADMIN)
        assert listed.status_code == 200 and ref.id in listed.text
        assert client.post("/admin/login", data={"token": TOKEN}).status_code == 303
        page = client.get("/admin/queues/waits?state=awaiting")
        assert page.status_code == 200 and "awaiting event approval:http-1" in page.text
        detail = client.get(f"/admin/jobs/{ref.id}")
        assert detail.status_code == 200 and 'id="job-event">approval:http-1<' in detail.text
        client.cookies.clear()
        answer = client.post("/api/events/approval:http-1", json={"data": {"ok": True}}, headers=ADMIN)
        assert answer.status_code == 200 and answer.json() == {"resumed": 1}
        assert _resumed_with(app, ref.id, database_url) == {"ok": True}
        own = client.post("/api/events/user:alice:approval:run-9", json={"data": "mine"}, headers=alice)
        assert own.status_code == 200 and own.json() == {"resumed": 0}
        other = client.post("/api/events/user:bob:approval:run-9", json={}, headers=alice)
        assert other.status_code == 403
        for bad in (HOSTILE, "x" * 201, ":starts-with-colon", "spaces%20here"):
            response = client.post(f"/api/events/{bad}", json={"data": 1}, headers=ADMIN)
            assert 400 <= response.status_code < 500, (bad, response.status_code)
            assert "script" not in response.text and "x" * 50 not in response.text
        unknown_field = client.post("/api/events/approval:http-2", json={"nope": 1}, headers=ADMIN)
        assert unknown_field.status_code == 422
    # Alice's signal was kept: her job that starts waiting now gets it at once.
    mine = app.jobs.enqueue("test.wait.waiter", {"token": "http-kept", "event": "user:alice:approval:run-9"})
    assert _resumed_with(app, mine.id, database_url) == "mine"


def _conveyor(settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conveyor", *args], env=env_for(settings), capture_output=True, text=True, timeout=60
    )


def test_conveyor_signal_resumes_the_waiting_job_and_refuses_bad_input(app, settings, workers, database_url):
    workers("waits")
    ref = app.jobs.enqueue("test.wait.waiter", {"token": "cli", "event": "approval:cli-1"})
    wait_for(lambda: app.jobs.get(ref.id).state == "awaiting", timeout=30)
    done = _conveyor(settings, "signal", "approval:cli-1", "--data", '{"by": "shell"}', "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"resumed": 1}
    assert _resumed_with(app, ref.id, database_url) == {"by": "shell"}
    again = _conveyor(settings, "signal", "approval:cli-1")
    assert again.returncode == 0 and "0 job(s) resumed" in again.stdout
    bad_name = _conveyor(settings, "signal", HOSTILE)
    assert bad_name.returncode == 2 and "event name" in bad_name.stderr and "script" not in bad_name.stderr
    bad_data = _conveyor(settings, "signal", "approval:cli-2", "--data", "{not json")
    assert bad_data.returncode == 2 and "--data" in bad_data.stderr and "not json" not in bad_data.stderr

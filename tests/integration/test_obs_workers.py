"""The Workers page's data, attempt history with tracebacks, search and filters: over real HTTP, on every broker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from conveyor.brokers.fleet import fleet_store
from tests.support.brokers import ALL_BROKERS
from tests.support.obs_support import ROOT, SECRET, TOKEN, CliProcess, api_server, cli_env, running
from tests.support.obs_support import broker_app as make_app
from tests.support.waiting import wait_for

QUEUE = "indexing"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(params=ALL_BROKERS)
def broker_app(request):
    app = make_app(request, request.param)
    yield app
    app.close()


@pytest.fixture
def api(broker_app):
    with api_server(broker_app) as url:
        with httpx.Client(base_url=url, timeout=10, headers=AUTH) as client:
            yield client


def _workers(api) -> list[dict]:
    response = api.get("/api/admin/workers")
    assert response.status_code == 200, response.text
    return response.json()


def _mine(api) -> dict | None:
    """The worker of this process (the test runs its worker in-process)."""
    return next((w for w in _workers(api) if w["pid"] == os.getpid() and w["state"] != "gone"), None)


def test_a_worker_shows_its_queues_jobs_in_flight_counts_and_leaves_as_stopped(broker_app, api):
    app = broker_app
    with running(app, threads=2):
        me = wait_for(lambda: _mine(api), timeout=20, message="the worker to register")
        # In-process (inline) workers run the queue's own concurrency.
        threads = app.queues[QUEUE].concurrency if app.capabilities.in_process else 2
        assert me["queues"] == [QUEUE] and me["threads"] == threads and me["state"] == "alive"
        assert me["version"] and me["host"] and me["startedAt"] and me["heartbeatAge"] < 30
        slow = app.jobs.enqueue("obs.work", {"n": 1, "sleep": 2.0})
        wait_for(
            lambda: slow.id in (_mine(api) or {}).get("inFlight", []),
            timeout=20,
            message="the running job in the worker's in-flight list",
        )
        app.jobs.enqueue("obs.work", {"n": 2, "fail": True})
        wait_for(
            lambda: (_mine(api) or {}).get("attemptsCompleted") == 1 and _mine(api)["attemptsFailed"] == 3,
            timeout=30,
            message="one job done and three failed attempts counted",
        )
        assert _mine(api)["inFlight"] == []
        # The slow job's start and end were written apart (its end merged into its start's entry).
        [attempt] = wait_for(
            lambda: api.get(f"/api/admin/jobs/{slow.id}").json()["history"],
            timeout=10,
            message="the slow job's attempt",
        )
        assert attempt["outcome"] == "completed" and attempt["runSeconds"] >= 1.9
        assert attempt["worker"] == _mine(api)["id"]
    gone = [w for w in _workers(api) if w["pid"] == os.getpid()]
    assert gone and all(w["state"] == "gone" and w["goneReason"] == "stopped" and w["goneAt"] for w in gone)


def test_each_failed_attempt_has_its_scrubbed_traceback_and_the_history_says_where_and_how(broker_app, api):
    app = broker_app
    with running(app):
        ref = app.jobs.enqueue("obs.leak", {"api_key": SECRET, "fail_first": 1})
        wait_for(lambda: app.broker.get_job(ref.id).state == "completed", timeout=30, message="the retry to complete")
        job = wait_for(
            lambda: (
                (j := api.get(f"/api/admin/jobs/{ref.id}").json())
                and [a["outcome"] for a in j["history"]] == ["failed", "completed"]
                and j
            ),
            timeout=10,
            message="both attempts in the history",
        )
    first, second = job["history"]
    assert [first["attempt"], second["attempt"]] == [1, 2]
    assert first["worker"].split(":")[1] == str(os.getpid())
    assert first["startedAt"] <= first["endedAt"] <= second["startedAt"] <= second["endedAt"]
    assert first["error"].startswith("RuntimeError: provider refused key [redacted] on attempt 1")
    trace = first["traceback"]
    assert "Traceback (most recent call last)" in trace and "_call_the_provider" in trace
    assert "[redacted]" in trace and SECRET not in json.dumps(job)
    assert second["traceback"] is None and second["error"] is None
    # Scrubbed before it left the worker, not only when shown: the store never held the secret.
    stored = fleet_store(app).attempts(ref.id)
    assert stored and all(SECRET not in (a.traceback or "") + (a.error or "") for a in stored)
    page = api.get(f"/admin/jobs/{ref.id}").text
    assert "_call_the_provider" in page and SECRET not in page


def test_jobs_are_found_by_id_and_by_key_and_lists_filter_by_job_type(broker_app, api):
    app = broker_app
    keyed = app.jobs.enqueue("obs.work", {"n": 1}, key="order-4711")
    other = app.jobs.enqueue("obs.leak", {"api_key": "x"})
    assert [j["id"] for j in api.get("/api/admin/search", params={"q": keyed.id}).json()["jobs"]] == [keyed.id]
    assert [j["id"] for j in api.get("/api/admin/search", params={"q": "order-4711"}).json()["jobs"]] == [keyed.id]
    assert api.get("/api/admin/search", params={"q": "no-such-key"}).json()["jobs"] == []
    assert api.get("/api/admin/search").status_code == 422
    listed = api.get("/api/admin/jobs", params={"queue": QUEUE, "state": "waiting", "job": "obs.leak"}).json()
    assert [j["id"] for j in listed["jobs"]] == [other.id]
    everything = api.get("/api/admin/jobs", params={"queue": QUEUE, "state": "waiting"}).json()
    assert {j["id"] for j in everything["jobs"]} == {keyed.id, other.id}
    # The dashboard's search box goes straight to the one job it finds.
    with httpx.Client(base_url=str(api.base_url), headers=AUTH, timeout=10) as browser:
        found = browser.get("/admin/search", params={"q": "order-4711"})
        assert found.status_code == 303 and found.headers["location"] == f"/admin/jobs/{keyed.id}"
        assert browser.get("/admin/search", params={"q": "nothing-like-it"}).status_code == 404


def test_live_regions_come_back_as_json_and_a_finished_job_is_no_longer_followed(broker_app, api):
    app = broker_app
    ref = app.jobs.enqueue("obs.work", {"n": 1})
    live = {"X-Conveyor-Live": "1"}
    waiting = api.get(f"/admin/jobs/{ref.id}", headers=live).json()
    assert waiting["follow"] is True and "waiting" in waiting["regions"]["summary"]
    with running(app):
        wait_for(lambda: app.broker.get_job(ref.id).state == "completed", message="the job to complete")
    done = wait_for(
        lambda: (
            (d := api.get(f"/admin/jobs/{ref.id}", headers=live).json())
            and "completed" in d["regions"]["history"]
            and d
        ),
        timeout=10,
        message="the completed attempt",
    )
    assert done["follow"] is False and "completed" in done["regions"]["summary"]
    queues = api.get("/admin/queues", headers=live).json()
    assert queues["follow"] is True and 'data-queue="indexing"' in queues["regions"]["queues_rows"]
    assert set(api.get("/admin/workers", headers=live).json()["regions"]) == {"workers"}
    script = api.get("/admin/static/live.js")
    assert script.status_code == 200 and "X-Conveyor-Live" in script.text


#: Seconds of silence before the broker recovers a dead worker's jobs, in the SIGKILL test: long enough
#: that the registry's own sweep (and "late", at 2.5 beats of a sixth of it) cannot beat the supervisor.
RECOVERY_AFTER = 8


@pytest.fixture(params=["postgres", "redis"])
def killed_env(request, clean_env):
    """A `conveyor worker`'s environment and an App on the same servers, for each real broker."""
    common = dict(
        CONVEYOR_IMPORTS="tests.support.obs_jobs",
        CONVEYOR_ADMIN_TOKEN=TOKEN,
        CONVEYOR_METRICS_PORT="0",
        CONVEYOR_MAINTENANCE_INTERVAL="0.5",
        # The stop at the end must not wait for a job still running (the default 600 s outlasts the 30 s
        # the test gives the stop, then SIGKILL).
        CONVEYOR_SHUTDOWN_TIMEOUT="2",
    )
    if request.param == "postgres":
        database_url = request.getfixturevalue("database_url")
        env = cli_env(
            clean_env,
            DATABASE_URL=database_url,
            CONVEYOR_BROKER="postgres",
            CONVEYOR_PG_LEASE_SECONDS=str(RECOVERY_AFTER),
            CONVEYOR_PG_RECOVERY_SECONDS="0.5",
            CONVEYOR_PG_POLL_SECONDS="0.5",
            **common,
        )
        app = make_app(request, "postgres", pg_lease_seconds=RECOVERY_AFTER)
    else:
        redis_url = request.getfixturevalue("redis_url")
        env = cli_env(
            clean_env,
            REDIS_URL=redis_url,
            CONVEYOR_BROKER="redis",
            CONVEYOR_HEARTBEAT_TIMEOUT=str(RECOVERY_AFTER),
            **common,
        )
        app = make_app(request, "redis", heartbeat_timeout=RECOVERY_AFTER)
    yield env, app
    app.close()


def test_a_worker_killed_with_sigkill_is_gone_at_once_and_its_job_runs_again_once(killed_env, tmp_path):
    """A real `conveyor worker`; its child is SIGKILLed mid-job. The supervisor reaps it and marks it gone
    within a few seconds (not after the recovery time); the broker's lease recovery still hands its job
    to the restarted process, which runs it once more, to completion."""
    env, app = killed_env
    supervisor = CliProcess(["worker", "--queues", QUEUE], env, tmp_path / "worker.log")
    try:
        with api_server(app) as url, httpx.Client(base_url=url, headers=AUTH, timeout=10) as api:
            ref = app.jobs.enqueue("obs.work", {"n": 1, "sleep": 4})
            victim = wait_for(
                lambda: next((w for w in _workers(api) if ref.id in w["inFlight"]), None),
                timeout=60,
                message="a worker running the job",
            )
            os.kill(victim["pid"], signal.SIGKILL)
            killed_at = time.monotonic()

            def seen() -> dict:
                return next(w for w in _workers(api) if w["id"] == victim["id"])

            dead = wait_for(
                lambda: (w := seen())["state"] != "alive" and w, timeout=30, interval=0.1, message="the kill seen"
            )
            assert dead["state"] == "gone" and dead["goneReason"] == "died", dead  # never "late" first
            assert time.monotonic() - killed_at < 5
            assert dead["goneAt"] and dead["inFlight"] == []
            # Its job comes back by lease recovery (not before: the fence holds) and runs once more, to the end.
            history = wait_for(
                lambda: (
                    (h := api.get(f"/api/admin/jobs/{ref.id}").json()["history"])
                    and h[-1].get("outcome") == "completed"
                    and h
                ),
                timeout=90,
                message="the job to run again elsewhere and complete",
            )
            assert [h["outcome"] for h in history] == ["lost", "completed"], history
            assert history[0]["worker"] == victim["id"] and history[1]["worker"] != victim["id"]
            # The attempt's outcome is in the history a moment before the job's own record says so (Redis acks
            # in a batch after the job returns).
            wait_for(lambda: app.jobs.get(ref.id).state == "completed", timeout=30, message="the job's record")
            assert seen()["goneReason"] == "died"  # the sweep does not rewrite it
            # The CLI shows the same registry.
            out = subprocess.run(
                [sys.executable, "-m", "conveyor", "workers", "--json"],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 0, out.stderr
            listed = {w["id"]: w for w in json.loads(out.stdout)}
            assert listed[victim["id"]]["state"] == "gone" and listed[victim["id"]]["gone_reason"] == "died"
            assert any(w["state"] == "alive" for w in listed.values())
            table = subprocess.run(
                [sys.executable, "-m", "conveyor", "workers"],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert table.returncode == 0 and str(victim["pid"]) in table.stdout and "died" in table.stdout
    finally:
        supervisor.stop()
    assert '"worker_marked_gone"' in supervisor.output()


def test_a_filtered_list_pages_through_every_job_of_the_type_once(broker_app, api):
    app = broker_app
    refs = app.jobs.enqueue_many([{"job": "obs.leak" if n % 3 == 0 else "obs.work", "payload": {}} for n in range(90)])
    leaks = {r.id for n, r in enumerate(refs) if n % 3 == 0}
    seen, cursor, pages = [], None, 0
    while True:
        params = {"queue": QUEUE, "state": "waiting", "job": "obs.leak", "limit": 12}
        if cursor:
            params["cursor"] = cursor
        page = api.get("/api/admin/jobs", params=params).json()
        assert all(j["job"] == "obs.leak" for j in page["jobs"])
        seen += [j["id"] for j in page["jobs"]]
        pages += 1
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(leaks) and pages == 3

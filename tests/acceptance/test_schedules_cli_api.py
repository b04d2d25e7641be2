"""`conveyor schedules` / `conveyor scheduler` as users run them, and the /api/schedules routes."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import httpx

from conveyor.platform.scheduling import schedules
from tests.support.obs_support import api_server
from tests.support.sched_jobs import make_app, runs


def conveyor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conveyor", *args], capture_output=True, text=True, timeout=120)


def test_schedules_cli_creates_lists_pauses_resumes_deletes_and_the_scheduler_fires(database_url, redis_url, clean_env):
    for name, value in {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "CONVEYOR_BROKER": "redis",
        "CONVEYOR_IMPORTS": "tests.support.sched_jobs",
    }.items():
        clean_env.setenv(name, value)
    bad = conveyor("schedules", "create", "--cron", "*/5 * * *", "--job", "test.record", "--payload", '{"note": "x"}')
    assert bad.returncode == 2 and "must have 5 fields" in bad.stderr
    bad = conveyor(
        "schedules",
        "create",
        "--cron",
        "0 9 * * *",
        "--timezone",
        "Europe/Atlantis",
        "--job",
        "test.record",
        "--payload",
        '{"note": "x"}',
    )
    assert bad.returncode == 2 and "unknown time zone 'Europe/Atlantis'" in bad.stderr

    # Yearly, so the wall clock cannot bring a second occurrence due while the test runs.
    made = conveyor(
        "schedules",
        "create",
        "--cron",
        "0 0 1 1 *",
        "--timezone",
        "Europe/Berlin",
        "--name",
        "yearly",
        "--job",
        "test.record",
        "--payload",
        '{"note": "cli"}',
    )
    assert made.returncode == 0, made.stderr
    schedule = json.loads(made.stdout)
    assert (schedule["name"], schedule["enabled"], schedule["misfire_policy"]) == ("yearly", True, "once")
    listed = conveyor("schedules", "list")
    assert "yearly" in listed.stdout and "Europe/Berlin" in listed.stdout

    # Due now: a pass of the scheduler fires it once; a second pass finds nothing due.
    app = make_app(database_url, redis_url)
    try:
        with app.pool.connection() as conn:
            conn.execute("UPDATE schedules SET next_fire_at = now() - interval '1 second'")
        once = conveyor("scheduler", "--once")
        assert once.returncode == 0 and json.loads(once.stdout.splitlines()[-1]) == {"fired": 1, "deduplicated": 0}
        assert json.loads(conveyor("scheduler", "--once").stdout.splitlines()[-1])["fired"] == 0
        assert app.broker.queue_counts("scheduling").waiting == 1
    finally:
        app.close()

    assert json.loads(conveyor("schedules", "pause", "yearly").stdout)["enabled"] is False
    assert json.loads(conveyor("schedules", "resume", schedule["id"]).stdout)["enabled"] is True
    assert conveyor("schedules", "delete", "yearly").returncode == 0
    gone = conveyor("schedules", "show", "yearly")
    assert gone.returncode == 2 and "no schedule 'yearly'" in gone.stderr


def test_schedule_routes_need_the_admin_token_and_give_clear_errors(database_url):
    app = make_app(database_url, admin_token="t0ken-schedules-3a9c")
    auth = {"Authorization": "Bearer t0ken-schedules-3a9c"}
    stack = contextlib.ExitStack()
    try:
        # The real app on a real server (the schedules router among the others).
        client = stack.enter_context(httpx.Client(base_url=stack.enter_context(api_server(app)), timeout=30))
        assert client.get("/api/schedules").status_code == 401
        assert client.get("/api/schedules", headers={"Authorization": "Bearer wrong"}).status_code == 401
        bad = client.post(
            "/api/schedules", headers=auth, json={"cron": "0 25 * * *", "job": "test.record", "payload": {"note": "x"}}
        )
        assert bad.status_code == 422 and "invalid cron expression '0 25 * * *'" in bad.json()["detail"]
        created = client.post(
            "/api/schedules",
            headers=auth,
            json={
                "cron": "@daily",
                "timezone": "America/New_York",
                "job": "test.record",
                "payload": {"note": "api"},
                "misfire_policy": "skip",
            },
        )
        assert created.status_code == 201
        sid = created.json()["id"]
        assert [s["id"] for s in client.get("/api/schedules", headers=auth).json()] == [sid]
        assert client.post(f"/api/schedules/{sid}/pause", headers=auth).json()["enabled"] is False
        assert client.post(f"/api/schedules/{sid}/resume", headers=auth).json()["enabled"] is True
        assert client.get(f"/api/schedules/{sid}", headers=auth).json()["fires"] == []
        assert client.delete(f"/api/schedules/{sid}", headers=auth).status_code == 204
        assert client.get(f"/api/schedules/{sid}", headers=auth).status_code == 404
        with app.pool.connection() as conn:
            assert schedules.list_schedules(conn) == []
    finally:
        stack.close()
        app.close()

    closed = make_app(database_url)  # no admin token configured: the routes are closed
    try:
        with api_server(closed) as base, httpx.Client(base_url=base, timeout=30) as client:
            assert "CONVEYOR_ADMIN_TOKEN is not set" in client.get("/api/schedules", headers=auth).text
    finally:
        closed.close()


def test_two_scheduler_processes_fire_each_due_occurrence_once_and_stop_on_sigterm(database_url, redis_url, clean_env):
    import signal
    import tempfile
    from pathlib import Path

    from tests.support.waiting import wait_for

    for name, value in {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "CONVEYOR_BROKER": "redis",
        "CONVEYOR_IMPORTS": "tests.support.sched_jobs",
        "CONVEYOR_SCHEDULER_INTERVAL": "0.05",
    }.items():
        clean_env.setenv(name, value)
    app = make_app(database_url, redis_url)
    with app.pool.connection() as conn:
        for i in range(50):  # yearly: the wall clock brings no second occurrence due during the test
            schedules.create_schedule(
                conn, app.job_types, cron="0 0 1 1 *", job="test.record", payload={"note": f"n{i}"}
            )
    logs = [Path(tempfile.mkstemp(prefix="conveyor-scheduler-")[1]) for _ in range(2)]
    handles = [log.open("wb") for log in logs]
    procs = [
        subprocess.Popen([sys.executable, "-m", "conveyor", "scheduler"], stdout=subprocess.DEVNULL, stderr=handle)
        for handle in handles
    ]
    try:
        wait_for(
            lambda: all("scheduler_started" in log.read_text() for log in logs),
            timeout=60,
            message="both schedulers running",
        )
        # Both are passing over the table; make every schedule due at once.
        with app.pool.connection() as conn:
            conn.execute("UPDATE schedules SET next_fire_at = now() - interval '1 second'")

        def advanced() -> bool:
            with app.pool.connection() as conn:
                return conn.execute("SELECT count(*) FROM schedules WHERE next_fire_at <= now()").fetchone()[0] == 0

        wait_for(advanced, timeout=60, message="both schedulers to pass over the due schedules")
        assert app.broker.queue_counts("scheduling").waiting == 50
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=30) for proc in procs]
        app.close()
        for handle, log in zip(handles, logs):
            handle.close()
            log.unlink()
    assert codes == [0, 0]


def test_conveyor_up_runs_the_scheduler_with_the_workers(database_url, redis_url, clean_env):
    import signal
    import tempfile
    from pathlib import Path

    from tests.support.waiting import wait_for

    for name, value in {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "CONVEYOR_BROKER": "redis",
        "CONVEYOR_IMPORTS": "tests.support.sched_jobs",
        "CONVEYOR_SCHEDULER_INTERVAL": "0.1",
        "CONVEYOR_METRICS_PORT": "0",
        "CONVEYOR_SHUTDOWN_TIMEOUT": "10",
        "CONVEYOR_WORKER_IDLE_TIMEOUT": "0.1",  # six idle worker groups stop at the end
    }.items():
        clean_env.setenv(name, value)
    app = make_app(database_url, redis_url)
    with app.pool.connection() as conn:
        schedule = schedules.create_schedule(
            conn, app.job_types, cron="0 0 1 1 *", job="test.record", payload={"note": "from-up"}
        )
        conn.execute("UPDATE schedules SET next_fire_at = now() - interval '1 second'")
    log = Path(tempfile.mkstemp(prefix="conveyor-up-")[1])
    with log.open("wb") as out:
        up = subprocess.Popen(
            [sys.executable, "-m", "conveyor", "up", "--port", "0"], stdout=subprocess.DEVNULL, stderr=out
        )
        try:
            wait_for(
                lambda: runs(app) == [{"note": "from-up"}],
                timeout=90,
                message="the schedule's job to run under conveyor up",
            )
            with app.pool.connection() as conn:
                assert schedules.fires(conn, schedule.id)[0].status == "enqueued"
        finally:
            up.send_signal(signal.SIGTERM)
            code = up.wait(timeout=60)
            app.close()
    assert code == 0, log.read_text()[-2000:]
    log.unlink()

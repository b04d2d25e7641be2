"""`conveyor api` over real HTTP: admin auth, queue metrics, jobs, actions, dashboard, /metrics, OpenAPI."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from conveyor.api import sessions
from conveyor.api.auth import COOKIE
from tests.support.obs_support import SECRET, TOKEN, CliProcess, Receiver, api_server, cli_env, redis_app, value, worker
from tests.support.waiting import wait_for

QUEUE = "indexing"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

#: Every admin route, with a method; ids and queues need not exist (auth comes first).
ADMIN_ROUTES = [
    ("GET", "/api/admin/queue-metrics"),
    ("GET", "/api/admin/jobs?queue=indexing&state=failed"),
    ("GET", "/api/admin/jobs"),
    ("GET", "/api/admin/jobs/some-id"),
    ("POST", "/api/admin/jobs/some-id/retry"),
    ("POST", "/api/admin/jobs/some-id/promote"),
    ("POST", "/api/admin/jobs/some-id/cancel"),
    ("POST", "/api/admin/bulk/retry"),
    ("DELETE", "/api/admin/jobs/some-id"),
    ("POST", "/api/admin/queues/indexing/retry-failed"),
    ("POST", "/api/admin/queues/indexing/pause"),
    ("POST", "/api/admin/queues/indexing/resume"),
    ("GET", "/admin/queues"),
    ("GET", "/admin/queues/indexing?state=failed"),
    ("GET", "/admin/jobs/some-id"),
    ("POST", "/admin/login"),
    ("GET", "/api/admin/workers"),
    ("GET", "/api/admin/search?q=some-id"),
    ("GET", "/admin/workers"),
    ("GET", "/admin/search?q=some-id"),
]


@pytest.fixture
def app(redis_url):
    app = redis_app(redis_url)
    yield app
    app.close()


@pytest.fixture
def api(app):
    with app.pool.connection() as conn:  # the sign-in throttle counts per address: start each test afresh
        conn.execute("DELETE FROM admin_login_failures")
    with api_server(app) as url:
        with httpx.Client(base_url=url, timeout=10) as client:
            yield client


@pytest.fixture
def workers(redis_url):
    worker_app = redis_app(redis_url)
    with worker(worker_app, QUEUE):
        yield worker_app
    worker_app.close()


def session(app=None) -> dict:
    """A live dashboard session cookie of ``app`` as a header (none given: a made-up cookie)."""
    cookie = sessions.open_session(app, "test") if app is not None else "made-up-session-cookie"
    return {"Cookie": f"{COOKIE}={cookie}"}


def metrics_of(api) -> dict:
    response = api.get("/api/admin/queue-metrics", headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()


# -- access ---------------------------------------------------------------------


@pytest.mark.parametrize("method,path", ADMIN_ROUTES)
def test_every_admin_route_answers_401_without_a_token_and_with_a_wrong_one(api, method, path):
    assert api.request(method, path).status_code == 401
    assert api.request(method, path, headers={"Authorization": "Bearer wrong-token"}).status_code == 401
    assert api.request(method, path, headers={"Authorization": f"Bearer {TOKEN}x"}).status_code == 401
    assert api.request(method, path, headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
    assert api.request(method, path, headers=session()).status_code == 401


def test_admin_routes_are_closed_when_no_token_is_configured(redis_url):
    app = redis_app(redis_url, admin_token=None)
    try:
        with api_server(app) as url, httpx.Client(base_url=url) as client:
            for method, path in ADMIN_ROUTES:
                for headers in ({}, {"Authorization": "Bearer x"}, {"Authorization": "Bearer anything"}):
                    response = client.request(method, path, headers=headers)
                    assert response.status_code == 403, (method, path, response.status_code)
            assert client.get("/metrics").status_code == 200  # not an admin route
    finally:
        app.close()


def test_the_dashboard_signs_in_with_the_token_then_uses_a_session_cookie(api, app):
    page = api.get("/admin/queues")
    assert page.status_code == 401 and 'name="token"' in page.text
    wrong = api.post("/admin/login", data={"token": "nope", "next": "/admin/queues"})
    assert wrong.status_code == 401 and COOKIE not in wrong.cookies
    response = api.post("/admin/login", data={"token": TOKEN, "next": "/admin/queues/indexing"})
    assert response.status_code == 303 and response.headers["location"] == "/admin/queues/indexing"
    cookie = response.cookies[COOKIE]
    assert TOKEN not in cookie and TOKEN not in response.headers["set-cookie"]
    assert "httponly" in response.headers["set-cookie"].lower()
    assert "samesite=strict" in response.headers["set-cookie"].lower()
    api.cookies.clear()
    assert api.get("/admin/queues", headers=session(app)).status_code == 200
    # A change with only the cookie needs the dashboard's header (no other site can send it).
    assert api.post("/api/admin/queues/indexing/pause", headers=session(app)).status_code == 401
    paused = api.post("/api/admin/queues/indexing/pause", headers={**session(app), "X-Requested-With": "conveyor"})
    assert paused.status_code == 200 and paused.json()["paused"] is True
    # Only back into the dashboard after sign-in.
    elsewhere = api.post("/admin/login", data={"token": TOKEN, "next": "https://evil.example/"})
    assert elsewhere.headers["location"] == "/admin/queues"


# -- reading ----------------------------------------------------------------------


def test_queue_metrics_count_real_jobs(api, app, workers, tmp_path):
    marker = tmp_path / "fail"
    marker.touch()
    for n in range(3):
        app.jobs.enqueue("obs.work", {"n": n})
    for n in range(2):
        app.jobs.enqueue("obs.work", {"n": 10 + n, "fail_while": str(marker)})
    wait_for(
        lambda: metrics_of(api)[QUEUE]["completedTotal"] == 3 and metrics_of(api)[QUEUE]["failed"] == 2,
        message="3 completed and 2 failed jobs",
    )
    assert api.post(f"/api/admin/queues/{QUEUE}/pause", headers=AUTH).json()["paused"] is True
    for n in range(4):
        app.jobs.enqueue("obs.work", {"n": 20 + n})
    app.jobs.enqueue("obs.work", {"n": 30}, delay=600)
    m = metrics_of(api)
    assert m[QUEUE] == {
        "active": 0,
        "running": 0,
        "prefetched": 0,
        "waiting": 4,
        "delayed": 1,
        "awaiting": 0,
        "failed": 2,
        "completedTotal": 3,
        "failedTotal": 2,
        "paused": True,
    }
    assert set(m) == {"agent", "build", "critical", "llm", "indexing", "scheduling", "nudge"}
    assert m["critical"] == {
        "active": 0,
        "running": 0,
        "prefetched": 0,
        "waiting": 0,
        "delayed": 0,
        "awaiting": 0,
        "failed": 0,
        "completedTotal": 0,
        "failedTotal": 0,
        "paused": False,
    }
    # Retry all failed, resume: everything finishes, and the totals say so.
    marker.unlink()
    assert api.post(f"/api/admin/queues/{QUEUE}/retry-failed", headers=AUTH).json() == {"retried": 2}
    assert api.post(f"/api/admin/queues/{QUEUE}/resume", headers=AUTH).json()["paused"] is False
    wait_for(lambda: metrics_of(api)[QUEUE]["completedTotal"] == 9, message="all 9 jobs completed")
    final = metrics_of(api)[QUEUE]
    assert (final["waiting"], final["failed"], final["failedTotal"], final["delayed"]) == (0, 0, 2, 1)


def test_jobs_are_listed_by_state_with_cursor_paging(api, app, workers):
    ids = {app.jobs.enqueue("obs.work", {"n": n}).id for n in range(7)}
    wait_for(lambda: metrics_of(api)[QUEUE]["completedTotal"] == 7, message="7 completed jobs")
    seen, cursor, pages = [], None, 0
    while True:
        params = {"queue": QUEUE, "state": "completed", "limit": 3, **({"cursor": cursor} if cursor else {})}
        page = api.get("/api/admin/jobs", params=params, headers=AUTH).json()
        pages += 1
        seen += [j["id"] for j in page["jobs"]]
        assert all(j["state"] == "completed" and j["attempts"] == 1 for j in page["jobs"])
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert pages == 3 and len(seen) == 7 and set(seen) == ids
    assert api.get("/api/admin/jobs", params={"queue": QUEUE, "state": "waiting"}, headers=AUTH).json()["jobs"] == []
    assert api.get("/api/admin/jobs", params={"queue": "nope", "state": "failed"}, headers=AUTH).status_code == 404
    assert api.get("/api/admin/jobs", params={"queue": QUEUE, "state": "lost"}, headers=AUTH).status_code == 422
    bad = api.get("/api/admin/jobs", params={"queue": QUEUE, "state": "failed", "cursor": "x"}, headers=AUTH)
    assert bad.status_code == 400


def test_job_detail_retry_and_delete(api, app, workers, tmp_path):
    marker = tmp_path / "fail"
    marker.touch()
    ref = app.jobs.enqueue("obs.work", {"n": 1, "api_key": SECRET, "fail_while": str(marker)}, key="detail-key")
    wait_for(
        lambda: api.get(f"/api/admin/jobs/{ref.id}", headers=AUTH).json()["state"] == "failed",
        message="the job to fail for good",
    )
    job = api.get(f"/api/admin/jobs/{ref.id}", headers=AUTH).json()
    assert job["payload"]["api_key"] == "[redacted]" and job["payload"]["n"] == 1
    assert (job["attempts"], job["maxAttempts"], job["key"], job["queue"]) == (3, 3, "detail-key", QUEUE)
    assert job["error"].startswith("JobError: obs.work 1 failed on purpose")
    assert job["finishedAt"] >= job["startedAt"] >= job["enqueuedAt"] and job["runSeconds"] >= 0
    assert api.get("/api/admin/jobs/unknown", headers=AUTH).status_code == 404

    marker.unlink()
    retried = api.post(f"/api/admin/jobs/{ref.id}/retry", headers=AUTH)
    assert retried.status_code == 200 and retried.json()["state"] in ("waiting", "active", "completed")
    wait_for(
        lambda: api.get(f"/api/admin/jobs/{ref.id}", headers=AUTH).json()["state"] == "completed",
        message="the retried job to complete",
    )
    assert api.post(f"/api/admin/jobs/{ref.id}/retry", headers=AUTH).status_code == 409
    assert api.post("/api/admin/jobs/unknown/retry", headers=AUTH).status_code == 404

    assert api.delete(f"/api/admin/jobs/{ref.id}", headers=AUTH).json() == {"deleted": ref.id}
    assert api.get(f"/api/admin/jobs/{ref.id}", headers=AUTH).status_code == 404
    assert api.delete(f"/api/admin/jobs/{ref.id}", headers=AUTH).status_code == 404

    running = app.jobs.enqueue("obs.work", {"n": 2, "sleep": 2})
    wait_for(
        lambda: api.get(f"/api/admin/jobs/{running.id}", headers=AUTH).json()["state"] == "active",
        message="the slow job to start",
    )
    assert api.delete(f"/api/admin/jobs/{running.id}", headers=AUTH).status_code == 409


def test_a_paused_queue_is_not_consumed_until_resumed(api, app, workers):
    api.post(f"/api/admin/queues/{QUEUE}/pause", headers=AUTH)
    ref = app.jobs.enqueue("obs.work", {"n": 1})
    enqueued_ms = time.time() * 1000

    def heartbeat_ms() -> float:
        ns = app.settings.redis_namespace
        return app.broker.client.zscore(f"{ns}:__heartbeats__", workers.broker.broker_id) or 0

    # The worker stays alive and polling (its fetches back off to 1 s at most) for 1.5 s past the enqueue...
    wait_for(lambda: heartbeat_ms() > enqueued_ms + 1500, timeout=10, message="the worker to keep polling")
    # ...and the job is still waiting.
    assert api.get(f"/api/admin/jobs/{ref.id}", headers=AUTH).json()["state"] == "waiting"
    api.post(f"/api/admin/queues/{QUEUE}/resume", headers=AUTH)
    wait_for(
        lambda: api.get(f"/api/admin/jobs/{ref.id}", headers=AUTH).json()["state"] == "completed",
        message="the job to run after resume",
    )


def test_the_dashboard_renders_queues_jobs_and_a_job(api, app, workers, tmp_path):
    marker = tmp_path / "fail"
    marker.touch()
    ref = app.jobs.enqueue("obs.work", {"n": 1, "api_key": SECRET, "fail_while": str(marker)}, priority=6)
    wait_for(lambda: app.broker.queue_counts(QUEUE).failed == 1, message="a failed job")
    assert api.get(f"/api/admin/jobs/{ref.id}", headers=AUTH).json()["priority"] == 6
    cookies = session(app)
    overview = api.get("/admin/queues", headers=cookies)
    assert overview.status_code == 200 and 'data-queue="indexing"' in overview.text
    listing = api.get(f"/admin/queues/{QUEUE}?state=failed", headers=cookies)
    assert ref.id in listing.text and 'data-bulk="retry"' in listing.text
    page = api.get(f"/admin/jobs/{ref.id}", headers=cookies)
    assert page.status_code == 200 and "failed on purpose" in page.text and "[redacted]" in page.text
    assert '<dd id="job-priority">6</dd>' in page.text
    assert api.get("/admin/jobs/unknown", headers=cookies).status_code == 404
    assert api.get("/admin/queues/unknown", headers=cookies).status_code == 404


def test_openapi_spec_is_served_and_lists_the_admin_routes(api):
    spec = api.get("/openapi.json").json()
    for path in (
        "/api/admin/queue-metrics",
        "/api/admin/jobs",
        "/api/admin/jobs/{job_id}",
        "/api/admin/jobs/{job_id}/retry",
        "/api/admin/queues/{queue}/retry-failed",
        "/api/admin/queues/{queue}/pause",
        "/api/admin/queues/{queue}/resume",
        "/metrics",
        "/api/admin/workers",
        "/api/admin/search",
    ):
        assert path in spec["paths"], path
    assert "delete" in spec["paths"]["/api/admin/jobs/{job_id}"]
    assert "completedTotal" in json.dumps(spec["components"]["schemas"]["QueueMetrics"])


def test_metrics_endpoint_serves_queue_depth_and_this_processes_counts(api, app):
    app.broker.pause_queue(QUEUE)
    for n in range(3):
        app.jobs.enqueue("obs.work", {"n": n}, key=f"k{n}")
    app.jobs.enqueue("obs.work", {"n": 0}, key="k0")
    app.jobs.enqueue("obs.work", {"n": 9}, delay=600)
    text = api.get("/metrics").text
    assert value(text, "conveyor_broker_up") == 1
    assert value(text, "conveyor_queue_depth", queue=QUEUE, state="waiting") == 3
    assert value(text, "conveyor_queue_depth", queue=QUEUE, state="delayed") == 1
    assert value(text, "conveyor_queue_paused", queue=QUEUE) == 1
    assert value(text, "conveyor_queue_oldest_waiting_seconds", queue=QUEUE) >= 0
    assert value(text, "conveyor_jobs_enqueued_total", queue=QUEUE, job="obs.work") == 4
    assert value(text, "conveyor_jobs_deduplicated_total", queue=QUEUE, job="obs.work") == 1


# -- secrets ------------------------------------------------------------------------


def test_a_failed_jobs_secret_appears_in_no_page_json_log_or_webhook(api, app, redis_url, clean_env, tmp_path):
    receiver = Receiver("ok")
    env = cli_env(
        clean_env,
        REDIS_URL=redis_url,
        CONVEYOR_BROKER="redis",
        CONVEYOR_IMPORTS="tests.support.obs_jobs",
        CONVEYOR_QUEUES__INDEXING__MIN_BACKOFF="0.02",
        CONVEYOR_QUEUES__INDEXING__MAX_BACKOFF="0.05",
        JOB_FAILURE_WEBHOOK_URL=receiver.url,
        CONVEYOR_ADMIN_TOKEN=TOKEN,
        CONVEYOR_METRICS_PORT="0",
        CONVEYOR_LOG_LEVEL="DEBUG",
        CONVEYOR_PUBLIC_URL="http://dash.example",
    )
    process = CliProcess(["worker", "--queues", QUEUE], env, tmp_path / "worker.log")
    try:
        ref = app.jobs.enqueue("obs.work", {"n": 1, "api_key": SECRET, "fail": True})
        wait_for(lambda: receiver.count() == 1, timeout=60, message="the failure alert")
    finally:
        code = process.stop()
        receiver.close()
    assert code == 0
    logs = process.output()
    assert ref.id in logs and '"event":"failed"' in logs  # the worker did log the job
    body = receiver.requests[0]["body"]
    assert ref.id in body and f"http://dash.example/admin/jobs/{ref.id}" in body
    cookies = session(app)
    shown = [
        logs,
        body,
        api.get(f"/api/admin/jobs/{ref.id}", headers=AUTH).text,
        api.get("/api/admin/jobs", params={"queue": QUEUE, "state": "failed"}, headers=AUTH).text,
        api.get(f"/admin/jobs/{ref.id}", headers=cookies).text,
        api.get(f"/admin/queues/{QUEUE}?state=failed", headers=cookies).text,
        api.get("/metrics").text,
    ]
    for text in shown:
        assert SECRET not in text
        assert TOKEN not in text


def test_errors_are_scrubbed_of_payload_and_settings_secrets(app):
    """A processor that puts a secret into its exception: the API and alerts still never show it."""
    from dramatiq import Message

    from conveyor.brokers.base import JobRecord
    from conveyor.inspector import Inspector
    from conveyor.middleware.webhook import FailureWebhook

    record = JobRecord(
        id="j1",
        queue=QUEUE,
        job="obs.work",
        state="failed",
        attempts=3,
        payload={"n": 1, "api_key": SECRET},
        error=f"bad key {SECRET} for token {TOKEN}",
    )
    view = Inspector(app)._view(record)
    assert SECRET not in view.error and TOKEN not in view.error and view.payload["api_key"] == "[redacted]"
    message = Message(
        queue_name=QUEUE, actor_name="obs.work", args=({"n": 1, "api_key": SECRET},), kwargs={}, options={"attempt": 3}
    )
    alert = FailureWebhook(app.settings, app.job_types).alert(message, f"bad key {SECRET} / {TOKEN}")
    assert SECRET not in str(alert) and TOKEN not in str(alert)


def test_the_conveyor_api_command_serves_and_stops_on_sigterm(redis_url, clean_env, tmp_path):
    from tests.support.servers import free_port

    port = free_port()
    env = cli_env(
        clean_env,
        REDIS_URL=redis_url,
        CONVEYOR_BROKER="redis",
        CONVEYOR_ADMIN_TOKEN=TOKEN,
        CONVEYOR_API_HOST="127.0.0.1",
        CONVEYOR_API_PORT=str(port),
    )
    process = CliProcess(["api"], env, tmp_path / "api.log")
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{base}/metrics", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout=60, message="conveyor api to answer")
        assert httpx.get(f"{base}/api/admin/queue-metrics").status_code == 401
        answer = httpx.get(f"{base}/api/admin/queue-metrics", headers=AUTH)
        assert answer.status_code == 200 and set(answer.json()) >= {"agent", "critical"}
    finally:
        code = process.stop()
    assert code == 0, process.output()[-2000:]
    assert TOKEN not in process.output()


def test_bulk_actions_count_first_then_act_only_on_jobs_that_still_match(api, app):
    app.broker.pause_queue(QUEUE)
    delayed = [app.jobs.enqueue("obs.work", {"n": n}, delay=3600).id for n in range(3)]
    waiting = app.jobs.enqueue("obs.work", {"n": 9}).id
    body = {"queue": QUEUE, "state": "delayed"}
    counted = api.post("/api/admin/bulk/promote", json={**body, "dryRun": True}, headers=AUTH).json()
    assert (counted["count"], counted["done"], sorted(counted["ids"])) == (3, 0, sorted(delayed))
    assert app.broker.queue_counts(QUEUE).delayed == 3  # a dry run moves nothing
    # A chunk of ids: only those still delayed in this queue are promoted; the waiting one is skipped.
    acted = api.post("/api/admin/bulk/promote", json={**body, "ids": [delayed[0], waiting]}, headers=AUTH).json()
    assert (acted["done"], acted["skipped"]) == (1, 1)
    assert app.broker.get_job(delayed[0]).state == "waiting" and app.broker.get_job(waiting).state == "waiting"
    rest = api.post("/api/admin/bulk/promote", json=body, headers=AUTH).json()
    assert (rest["count"], rest["done"]) == (2, 2)
    assert app.broker.queue_counts(QUEUE).delayed == 0

    # One promoted by id; then it is not delayed: 409. A filter an action does not apply to: 400, not echoed.
    later = app.jobs.enqueue("obs.work", {"n": 10}, delay=3600).id
    promoted = api.post(f"/api/admin/jobs/{later}/promote", headers=AUTH)
    assert promoted.status_code == 200 and promoted.json()["state"] == "waiting"
    assert api.post(f"/api/admin/jobs/{later}/promote", headers=AUTH).status_code == 409
    wrong = api.post("/api/admin/bulk/retry", json={"queue": QUEUE, "state": "waiting"}, headers=AUTH)
    assert wrong.status_code == 400 and "failed jobs only" in wrong.text
    running = api.post("/api/admin/bulk/delete", json={"queue": QUEUE, "state": "active"}, headers=AUTH)
    assert running.status_code == 400
    unknown = api.post("/api/admin/bulk/delete", json={"queue": "s3cr3t-q", "state": "waiting"}, headers=AUTH)
    assert unknown.status_code == 404
    assert api.post("/api/admin/bulk/explode", json=body, headers=AUTH).status_code == 422
    too_many = api.post("/api/admin/bulk/delete", json={**body, "ids": ["x"] * 101}, headers=AUTH)
    assert too_many.status_code == 422
    # An age: nothing here is an hour old, counted or sent by id.
    old = {"queue": QUEUE, "state": "waiting", "olderThan": 3600}
    assert api.post("/api/admin/bulk/purge", json={**old, "dryRun": True}, headers=AUTH).json()["count"] == 0
    young = api.post("/api/admin/bulk/purge", json={**old, "ids": [waiting]}, headers=AUTH).json()
    assert (young["done"], young["skipped"]) == (0, 1) and app.broker.get_job(waiting) is not None
    purged = api.post("/api/admin/bulk/purge", json={"queue": QUEUE, "state": "waiting"}, headers=AUTH).json()
    assert purged["done"] == 5 and app.broker.queue_counts(QUEUE).waiting == 0


def test_cancel_by_id_and_in_bulk_over_http(app, api):
    """POST /api/admin/jobs/{id}/cancel: a waiting or delayed job ends cancelled (200); an ended one is 409;
    an unknown id 404; the bulk form cancels what its filter matches."""
    app.broker.pause_queue(QUEUE)
    waiting = app.jobs.enqueue("obs.work", {"n": 1}).id
    cancelled = api.post(f"/api/admin/jobs/{waiting}/cancel", headers=AUTH)
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    again = api.post(f"/api/admin/jobs/{waiting}/cancel", headers=AUTH)
    assert again.status_code == 409 and "nothing to cancel" in again.text
    missing = api.post("/api/admin/jobs/no-such-s3cr3t/cancel", headers=AUTH)
    assert missing.status_code == 404 and "Traceback" not in missing.text
    assert api.post(f"/api/admin/jobs/{waiting}/cancel").status_code in (401, 403)
    delayed = [app.jobs.enqueue("obs.work", {"n": n}, delay=3600).id for n in range(3)]
    acted = api.post("/api/admin/bulk/cancel", json={"queue": QUEUE, "state": "delayed"}, headers=AUTH).json()
    assert (acted["count"], acted["done"]) == (3, 3)
    assert {app.broker.get_job(i).state for i in delayed} == {"cancelled"}
    wrong = api.post("/api/admin/bulk/cancel", json={"queue": QUEUE, "state": "failed"}, headers=AUTH)
    assert wrong.status_code == 400
    listed = api.get(f"/api/admin/jobs?queue={QUEUE}&state=cancelled", headers=AUTH)
    assert listed.status_code == 200 and len(listed.json()["jobs"]) == 4

"""Who may call what, over real HTTP: producer routes need a user's API key and show only that user's
records; the dashboard's sessions expire, end at logout and throttle wrong tokens; weak admin tokens are
refused at start; /metrics of a worker listens on loopback unless told otherwise."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conveyor import access
from conveyor.api.auth import COOKIE
from conveyor.app import App
from conveyor.platform import records
from conveyor.settings import Settings
from tests.support.obs_support import TOKEN, cli_env
from tests.support.platform_support import make_task, serve, user_key

ADMIN = {"Authorization": f"Bearer {TOKEN}"}
TEMPLATES = Path(__file__).parents[2] / "conveyor" / "api" / "templates"

#: Every producer route, with ids that need not exist (authentication comes first).
PRODUCER_ROUTES = [
    ("POST", "/api/tasks/t1/runs", {"content": "hi"}),
    ("GET", "/api/runs/run_x", None),
    ("GET", "/api/runs/run_x/stream", None),
    ("PUT", "/api/resources/doc1", {"title": "t", "body": "b"}),
    ("GET", "/api/resources/doc1", None),
    ("GET", "/api/resources/search?q=password", None),
    ("POST", "/api/builds", {"kind": "rollback", "agent_id": "a1"}),
    ("GET", "/api/builds/b1", None),
]


@pytest.fixture
def app(redis_url, database_url):
    app = App(
        Settings(
            broker="redis",
            redis_url=redis_url,
            database_url=database_url,
            admin_token=TOKEN,
            admin_session_seconds=3,
            admin_login_attempts=5,
            admin_login_window=60,
        )
    )
    yield app
    app.close()


def test_every_producer_route_needs_a_live_user_key(app):
    with app.pool.connection() as conn:
        access.create_user(conn, "alice")
        key_id, key = access.create_api_key(conn, "alice")
    with serve(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        for method, path, body in PRODUCER_ROUTES:
            for headers in (
                {},
                {"Authorization": "Bearer cvk_000000000000_nope"},
                {"Authorization": key},
                {"Authorization": f"Basic {key}"},
                {"Authorization": f"Bearer {key}x"},
            ):
                response = client.request(method, path, json=body, headers=headers)
                assert response.status_code == 401, (method, path, headers, response.status_code)
                assert response.headers["www-authenticate"] == "Bearer"
            # The admin token is not a user's key (only /api/builds takes it, as the operator's).
            expected = 401 if not path.startswith("/api/builds") else None
            if expected:
                assert client.request(method, path, json=body, headers=ADMIN).status_code == 401, path
        # A user key opens no admin route.
        assert client.get("/api/admin/queue-metrics", headers={"Authorization": f"Bearer {key}"}).status_code == 401
        assert client.get("/api/schedules", headers={"Authorization": f"Bearer {key}"}).status_code == 401
        live = {"Authorization": f"Bearer {key}"}
        assert client.get("/api/resources/search?q=x", headers=live).status_code == 200
        with app.pool.connection() as conn:
            assert access.revoke_api_key(conn, key_id) == "alice"
            assert access.api_keys(conn, "alice")[0].revoked_at is not None
        assert client.get("/api/resources/search?q=x", headers=live).status_code == 401  # at once
        with app.pool.connection() as conn:
            stored = conn.execute("SELECT digest FROM api_keys WHERE id = %s", (key_id,)).fetchone()[0]
        assert key not in stored and key_id in key  # only a digest is kept


def test_a_user_sees_and_changes_only_their_own_records(app):
    make_task(app, "t-alice", user_id="alice")
    make_task(app, "t-bob", user_id="bob")
    alice, bob = user_key(app, "alice"), user_key(app, "bob")
    with serve(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        started = client.post(
            "/api/tasks/t-alice/runs", json={"content": "my password is hunter2", "message_id": "m1"}, headers=alice
        )
        assert started.status_code == 202
        run_id = started.json()["run_id"]
        # Bob: alice's task, run and stream answer exactly as ids that do not exist.
        for foreign, missing in (
            ("/api/runs/" + run_id, "/api/runs/run_missing"),
            ("/api/runs/" + run_id + "/stream", "/api/runs/run_missing/stream"),
        ):
            a, b = client.get(foreign, headers=bob), client.get(missing, headers=bob)
            assert a.status_code == b.status_code == 404
            assert a.json()["detail"].replace(run_id, "X") == b.json()["detail"].replace("run_missing", "X")
        a = client.post("/api/tasks/t-alice/runs", json={"content": "hi"}, headers=bob)
        b = client.post("/api/tasks/t-nope/runs", json={"content": "hi"}, headers=bob)
        assert a.status_code == b.status_code == 404 and a.json()["detail"] == "no such task"
        # A message id alice took tells bob nothing: his own m1 is his own.
        mine = client.post("/api/tasks/t-bob/runs", json={"content": "other text", "message_id": "m1"}, headers=bob)
        assert mine.status_code == 202 and mine.json()["created"] is True
        assert client.get(f"/api/runs/{run_id}", headers=alice).status_code == 200

        # Resources: bob cannot read, replace or find alice's.
        assert (
            client.put(
                "/api/resources/note", json={"title": "Passwords", "body": "hunter2 is the password"}, headers=alice
            ).status_code
            == 202
        )
        # Resource ids are each user's own: alice's "note" answers bob as a free id does (no oracle) ...
        a, b = client.get("/api/resources/note", headers=bob), client.get("/api/resources/free", headers=bob)
        assert a.status_code == b.status_code == 404 and a.json() == b.json() == {"detail": "no such resource"}
        # ... and his PUT of "note" makes his own, as of a free id, and never replaces hers.
        for rid in ("note", "free"):
            mine = client.put(f"/api/resources/{rid}", json={"title": "mine", "body": "bob's text"}, headers=bob)
            assert mine.status_code == 202 and mine.json()["deduplicated"] is False, mine.text
            assert client.get(f"/api/resources/{rid}", headers=bob).json()["title"] == "mine"
        assert client.get("/api/resources/note", headers=alice).json()["title"] == "Passwords"  # untouched
        with app.pool.connection() as conn:
            assert records.get_resource(conn, "note", "alice").body == "hunter2 is the password"
            assert records.get_resource(conn, "note", "bob").body == "bob's text"
        assert (
            client.put("/api/resources/other", json={"user_id": "alice", "body": "x"}, headers=bob).status_code == 422
        )
        assert (
            client.put("/api/resources/other", json={"task_id": "t-alice", "body": "x"}, headers=bob).status_code == 404
        )
        # Search is always the caller's own: asking for alice's finds nothing.
        with app.pool.connection() as conn:
            conn.execute(
                "INSERT INTO resource_chunks (user_id, resource_id, seq, version, body) "
                "SELECT user_id, id, 1, version, body FROM resources WHERE id = 'note' AND user_id = 'alice'"
            )
        assert client.get("/api/resources/search", params={"q": "password"}, headers=alice).json()["results"]
        assert client.get("/api/resources/search", params={"q": "password"}, headers=bob).json()["results"] == []
        assert (
            client.get("/api/resources/search", params={"q": "password", "user_id": "alice"}, headers=bob).json()[
                "results"
            ]
            == []
        )

        # Builds: a user's own are theirs alone, and so are their agents.
        asked = client.post(
            "/api/builds",
            headers=alice,
            json={"kind": "rollback", "agent_id": "agent-alice", "target_version": "v1", "build_id": "b1"},
        )
        assert asked.status_code == 202, asked.text
        build_id = asked.json()["build_id"]
        assert client.get(f"/api/builds/{build_id}", headers=alice).json()["owner_id"] == "alice"
        a, b = client.get(f"/api/builds/{build_id}", headers=bob), client.get("/api/builds/b-none", headers=bob)
        assert a.status_code == b.status_code == 404
        assert client.get(f"/api/builds/{build_id}", headers=ADMIN).status_code == 200
        # Agent ids are each user's own: bob's "agent-alice" is another agent, and no answer tells him hers exists.
        his = client.post(
            "/api/builds", headers=bob, json={"kind": "rollback", "agent_id": "agent-alice", "target_version": "v1"}
        )
        assert his.status_code == 202, his.text
        with app.pool.connection() as conn:
            owners = dict(conn.execute("SELECT owner_id, agent_id FROM builds WHERE agent_id IS NOT NULL").fetchall())
            agents = dict(conn.execute("SELECT id, owner_id FROM agents").fetchall())
        assert owners["alice"] != owners["bob"] and agents == {owners["alice"]: "alice", owners["bob"]: "bob"}
        assert (
            client.post(
                "/api/builds",
                headers=bob,
                json={"kind": "rollback", "agent_id": "agent-bob", "target_version": "v1", "owner_id": "alice"},
            ).status_code
            == 422
        )
        mine = client.post(
            "/api/builds",
            headers=bob,
            json={"kind": "rollback", "agent_id": "agent-bob", "target_version": "v1", "build_id": "b1"},
        )
        assert mine.status_code == 202 and mine.json()["build_id"] != build_id  # his b1 is not hers


def test_search_snippets_are_escaped_text_with_the_matches_in_bold(app):
    # Forms Postgres's headline parser does not take for tags, so it passed them through live.
    body = 'Reset the password <img/src=x onerror=alert(1)> & "><svg/onload=alert(2)> <b onmouseover=alert(3)>x'
    with app.pool.connection() as conn:
        access.create_user(conn, "carol")
        version = records.upsert_resource(conn, id="xss", user_id="carol", task_id=None, title="t", body=body)
        conn.execute(
            "INSERT INTO resource_chunks (user_id, resource_id, seq, version, body) VALUES ('carol', 'xss', 1, %s, %s)",
            (version, body),
        )
        [hit] = records.search_resources(conn, "password", user_id="carol")
    assert "<img" not in hit.snippet and "<svg" not in hit.snippet and "<b onmouseover" not in hit.snippet
    assert "&lt;img/src=x onerror=alert(1)&gt;" in hit.snippet and "&amp;" in hit.snippet
    assert "&quot;&gt;&lt;svg/onload=alert(2)&gt;" in hit.snippet
    assert "<b>password</b>" in hit.snippet
    assert re.sub(r"</?b>", "", hit.snippet).count("<") == 0


def test_users_and_keys_commands_create_list_and_revoke(redis_url, database_url, clean_env):
    env = cli_env(clean_env, REDIS_URL=redis_url, DATABASE_URL=database_url, CONVEYOR_BROKER="redis")

    def conveyor(*args):
        return subprocess.run(
            [sys.executable, "-m", "conveyor", *args], env=env, capture_output=True, text=True, timeout=120
        )

    assert conveyor("users", "create", "dora").returncode == 0
    made = conveyor("keys", "create", "dora")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert key.startswith("cvk_") and len(key) > 40
    key_id = key.split("_")[1]
    listed = conveyor("keys", "list", "dora")
    assert key_id in listed.stdout and key not in listed.stdout and "live" in listed.stdout
    assert conveyor("keys", "create", "nobody").returncode == 2
    assert conveyor("users", "create", "../etc").returncode == 2
    assert conveyor("keys", "revoke", key_id).returncode == 0
    assert "revoked" in conveyor("keys", "list", "dora").stdout
    app = App(Settings(broker="redis", redis_url=redis_url, database_url=database_url))
    try:
        with app.pool.connection() as conn:
            assert access.key_user(conn, key) is None
    finally:
        app.close()


# -- the dashboard's session ------------------------------------------------------------------


def _sign_in(client, token=TOKEN):
    return client.post("/admin/login", data={"token": token, "next": "/admin/queues"})


def test_wrong_tokens_are_throttled_per_client_and_the_right_one_still_signs_in(app):
    with serve(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        for _ in range(5):
            assert _sign_in(client, "wrong-guess").status_code == 401
        throttled = _sign_in(client, "wrong-guess")
        assert throttled.status_code == 429 and throttled.headers["retry-after"] == "60"
        assert COOKIE not in client.cookies
        assert _sign_in(client).status_code == 303  # the right token is never refused for earlier failures
        assert COOKIE in client.cookies


def test_sessions_end_at_logout_and_expire(app):
    with serve(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        assert _sign_in(client).status_code == 303
        cookie = client.cookies[COOKIE]
        copied = {"Cookie": f"{COOKIE}={cookie}"}
        page = client.get("/admin/queues")
        assert page.status_code == 200
        csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', page.text).group(1)
        # Logout is a POST carrying the page's token: another site can neither GET it nor forge the form.
        assert client.get("/admin/logout").status_code == 405
        assert client.post("/admin/logout", data={"csrf": "0" * 64}).status_code == 403
        assert client.get("/admin/queues", headers=copied).status_code == 200
        out = client.post("/admin/logout", data={"csrf": csrf})
        assert out.status_code == 303
        client.cookies.clear()
        assert client.get("/admin/queues", headers=copied).status_code == 401  # the copy is dead too

        assert _sign_in(client).status_code == 303
        assert client.get("/admin/queues").status_code == 200
        time.sleep(3.5)  # admin_session_seconds=3: the server's clock ends it, whatever the cookie says
        assert client.get("/admin/queues").status_code == 401


def test_rotating_the_admin_token_ends_the_old_tokens_sessions(redis_url, database_url):
    first = App(Settings(broker="redis", redis_url=redis_url, database_url=database_url, admin_token=TOKEN))
    rotated = App(
        Settings(broker="redis", redis_url=redis_url, database_url=database_url, admin_token="rotated-admin-token-0b7d")
    )
    try:
        with serve(first) as base, httpx.Client(base_url=base, timeout=30) as client:
            assert _sign_in(client).status_code == 303
            cookie = {"Cookie": f"{COOKIE}={client.cookies[COOKIE]}"}
            assert client.get("/admin/queues", headers=cookie).status_code == 200
        with serve(rotated) as base, httpx.Client(base_url=base, timeout=30) as client:
            assert client.get("/admin/queues", headers=cookie).status_code == 401
    finally:
        first.close()
        rotated.close()


def test_every_dashboard_response_carries_the_security_headers_and_no_inline_script(app):
    with serve(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        for path in ("/admin/queues", "/admin/static/dashboard.js", "/api/runs/x", "/metrics", "/nope"):
            response = client.get(path)
            assert response.headers["x-frame-options"] == "DENY", path
            assert response.headers["x-content-type-options"] == "nosniff"
            assert response.headers["referrer-policy"] == "no-referrer"
            csp = response.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
        assert client.get("/admin/static/dashboard.js").status_code == 200
        assert client.get("/admin/static/..%2F..%2Fsettings.py").status_code == 404
    for template in TEMPLATES.glob("*.html"):
        text = template.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), template.name  # scripts are files, never inline
        assert not re.search(r"\son[a-z]+\s*=", text), template.name  # no inline event handlers


def test_a_weak_admin_token_is_refused_at_start(clean_env):
    for weak in ("x", "aaaaaaaaaaaaaaaaaaaaaaaa", "short-token"):
        env = cli_env(clean_env, CONVEYOR_ADMIN_TOKEN=weak, CONVEYOR_BROKER="inline")
        done = subprocess.run(
            [sys.executable, "-m", "conveyor", "api", "--port", "0"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert "CONVEYOR_ADMIN_TOKEN is too weak" in done.stderr and "Traceback" not in done.stderr
        assert f"'{weak}'" not in done.stderr and f"={weak}" not in done.stderr  # never quoted back
    assert Settings(admin_token="").admin_token.get_secret_value() == ""  # unset: admin stays closed


def test_worker_metrics_listen_on_loopback_unless_configured(clean_env):
    assert Settings().metrics_host == "127.0.0.1"
    clean_env.setenv("CONVEYOR_METRICS_HOST", "0.0.0.0")
    assert Settings().metrics_host == "0.0.0.0"
    compose = (Path(__file__).parents[2] / "compose" / "docker-compose.yml").read_text()
    assert 'CONVEYOR_METRICS_HOST: "0.0.0.0"' in compose  # compose sets it for Prometheus, explicitly


def test_the_openapi_document_says_who_may_call_each_route(app):
    from conveyor.api import create_app

    document = create_app(app).openapi()
    assert set(document["components"]["securitySchemes"]) == {"userKey", "adminToken"}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            schemes = {name for requirement in operation.get("security", []) for name in requirement}
            if path.startswith(("/api/tasks", "/api/runs", "/api/resources")):
                assert schemes == {"userKey"}, (method, path)
            elif path.startswith(("/api/builds", "/api/agents/upload-and-deploy", "/api/events")):
                assert schemes == {"userKey", "adminToken"}, (method, path)
            elif path == "/metrics":
                assert not schemes
            else:
                assert schemes == {"adminToken"}, (method, path)
            if schemes:
                assert "401" in operation["responses"], (method, path)

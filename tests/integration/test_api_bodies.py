"""How the API takes request bodies: credentials before the body, a cap by kind of body, the JSON checks
on the bytes (no parse) whatever the body claims to be."""

from __future__ import annotations

import json

import httpx
import pytest

from conveyor.api.auth import COOKIE
from conveyor.app import App
from conveyor.settings import Settings
from tests.support.obs_support import TOKEN
from tests.support.platform_support import make_task, serve, user_key

MiB = 1024 * 1024
UPLOAD = "/api/agents/upload-and-deploy"


@pytest.fixture
def app(redis_url, database_url):
    app = App(
        Settings(
            broker="redis",
            redis_url=redis_url,
            database_url=database_url,
            admin_token=TOKEN,
            api_max_json_bytes=MiB,
            api_max_body_bytes=4 * MiB,
            api_max_json_items=1000,
        )
    )
    make_task(app, "t1", user_id="alice")
    yield app
    app.close()


def test_a_body_without_credentials_is_refused_before_it_is_read(app):
    with serve(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        for headers in ({}, {"Authorization": "Bearer cvk_notakey_000"}, {"Authorization": "Bearer wrong"}):
            answer = client.post("/api/tasks/t1/runs", json={"content": "hi"}, headers=headers)
            assert answer.status_code == 401 and answer.headers["www-authenticate"] == "Bearer"
            assert answer.json()["detail"][0]["loc"] == ["header", "authorization"]
        # No body: the route's own answer, as before (here: 401 from its dependency, no matter the guard).
        assert client.get("/api/runs/run_x").status_code == 401
        # The sign-in form is the one body anyone may send.
        assert client.post("/admin/login", data={"token": TOKEN}).status_code == 303
        assert COOKIE in client.cookies
        user = user_key(app, "alice")
        assert client.post("/api/tasks/t1/runs", json={"content": "hi"}, headers=user).status_code == 202
        admin = {"Authorization": f"Bearer {TOKEN}"}
        made = {"cron": "0 0 1 1 *", "job": "resource.index", "payload": {}}
        assert client.post("/api/schedules", json=made, headers=admin).status_code in (201, 422)


def test_each_kind_of_body_has_its_cap(app):
    user = user_key(app, "alice")
    text = "x" * (2 * MiB)
    with serve(app) as base, httpx.Client(base_url=base, timeout=60) as client:
        # A resource's long text: up to CONVEYOR_API_MAX_BODY_BYTES; any other JSON body: the JSON cap.
        assert client.put("/api/resources/doc1", json={"body": text}, headers=user).status_code == 202
        assert client.post("/api/tasks/t1/runs", json={"content": text}, headers=user).status_code == 413
        # The upload route's raised cap is for its multipart form only; JSON there has the JSON cap.
        answer = client.post(
            UPLOAD, content=json.dumps({"a": text}), headers={**user, "content-type": "application/json"}
        )
        assert answer.status_code == 413
        # A body that names no type is parsed as JSON by FastAPI: checked and capped as JSON.
        nul = client.post("/api/tasks/t1/runs", content=b'{"content": "a\\u0000b"}', headers=user)
        assert nul.status_code == 400 and nul.json()["detail"][0]["loc"] == ["body"]
        many = client.post("/api/tasks/t1/runs", content=b"[" + b"0," * 2000 + b"0]", headers=user)
        assert many.status_code == 400 and "values" in many.json()["detail"][0]["msg"]
        deep = client.post(
            "/api/tasks/t1/runs", content=b"[" * 40 + b"]" * 40, headers={**user, "content-type": "text/plain"}
        )
        assert deep.status_code == 400 and "deeper" in deep.json()["detail"][0]["msg"]

"""``/api/admin/cron`` over real HTTP, on Redis and Postgres, with the agent platform absent: the admin
token guards every route, bad input is a 4xx naming the field and never the value, and a schedule put
there is what ``app.cron`` and the firer see."""

from __future__ import annotations

import httpx
import pytest

from conveyor import App, JobContext, Jobs, Payload, Queue
from tests.support.obs_support import TOKEN, api_server, settings

AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET = "hunter2-7f3a"

jobs = Jobs()


class Ping(Payload):
    who: str


@jobs.job("cron.ping", queue=Queue("pings"), payload=Ping)
def ping(payload: Ping, ctx: JobContext) -> None:
    pass


jobs.schedule("0 3 * * *", ping, Ping(who="code"), name="code-nightly")

GOOD = {"cron": "*/5 * * * *", "job": "cron.ping", "payload": {"who": "x"}, "tz": "Europe/Berlin"}


@pytest.fixture(params=["redis", "postgres"])
def app(request, database_url):
    servers = {"redis_url": request.getfixturevalue("redis_url")} if request.param == "redis" else {}
    app = App(
        settings(broker=request.param, database_url=database_url, platform=False, imports="", queues={}, **servers),
        jobs=[jobs],
    )
    yield app
    app.close()


@pytest.fixture
def api(app):
    with api_server(app) as url, httpx.Client(base_url=url, timeout=20) as client:
        yield client


def test_every_route_needs_the_admin_token(api):
    routes = [
        ("GET", "/api/admin/cron", None),
        ("GET", "/api/admin/cron/nightly", None),
        ("PUT", "/api/admin/cron/nightly", GOOD),
        ("POST", "/api/admin/cron/nightly/pause", None),
        ("POST", "/api/admin/cron/nightly/resume", None),
        ("DELETE", "/api/admin/cron/nightly", None),
    ]
    for method, path, body in routes:
        for headers in ({}, {"Authorization": "Bearer wrong-token-0000000000"}):
            response = api.request(method, path, json=body, headers=headers)
            assert response.status_code == 401, (method, path, response.text)


def test_put_list_pause_resume_remove(api, app):
    response = api.put("/api/admin/cron/nightly", json=GOOD, headers=AUTH)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["name"], body["source"], body["paused"], body["tz"]) == ("nightly", "managed", False, "Europe/Berlin")
    assert body["nextFire"]

    listed = api.get("/api/admin/cron", headers=AUTH).json()
    assert [(s["name"], s["source"]) for s in listed] == [("code-nightly", "code"), ("nightly", "managed")]
    assert app.cron.get("nightly").payload == {"who": "x"}

    paused = api.post("/api/admin/cron/nightly/pause", headers=AUTH).json()
    assert paused["paused"] is True and paused["nextFire"] is None
    assert api.post("/api/admin/cron/nightly/resume", headers=AUTH).json()["paused"] is False
    replaced = api.put("/api/admin/cron/nightly", json={**GOOD, "cron": "@daily", "paused": True}, headers=AUTH)
    assert (replaced.json()["cron"], replaced.json()["paused"]) == ("@daily", True)

    assert api.delete("/api/admin/cron/nightly", headers=AUTH).status_code == 204
    gone = api.delete("/api/admin/cron/nightly", headers=AUTH)
    assert (gone.status_code, gone.json()["detail"]) == (404, "no such schedule")
    assert api.get("/api/admin/cron/nightly", headers=AUTH).status_code == 404
    assert api.post("/api/admin/cron/nightly/pause", headers=AUTH).status_code == 404


@pytest.mark.parametrize(
    "name, change, field",
    [
        (f"Bad-{SECRET}", {}, "name"),
        ("code-nightly", {}, "name"),
        ("nightly", {"cron": f"61 {SECRET} * * *"}, "cron"),
        ("nightly", {"tz": f"Mars/{SECRET}"}, "timezone"),
        ("nightly", {"job": f"no.{SECRET}"}, "job"),
        ("nightly", {"payload": {"who": 7}}, "payload"),
        ("nightly", {"payload": {"who": SECRET, "role": SECRET}}, "payload"),
        ("nightly", {"payload": f"{SECRET}"}, "payload"),
        ("nightly", {"extra": SECRET}, "extra"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_field_without_the_value(api, app, name, change, field):
    response = api.put(f"/api/admin/cron/{name}", json={**GOOD, **change}, headers=AUTH)
    assert response.status_code == 422, response.text
    assert field in response.text
    assert SECRET not in response.text
    assert [s.name for s in app.cron.list()] == ["code-nightly"]


def test_a_code_schedule_is_read_only(api):
    for path in ("/api/admin/cron/code-nightly/pause", "/api/admin/cron/code-nightly/resume"):
        response = api.post(path, headers=AUTH)
        assert response.status_code == 422 and "declared in code" in response.text
    assert api.delete("/api/admin/cron/code-nightly", headers=AUTH).status_code == 422
    assert api.get("/api/admin/cron/code-nightly", headers=AUTH).json()["source"] == "code"

"""The groups and budgets views (issue 21) over real HTTP, on Redis and on Postgres: the admin API's
``/api/admin/queues/{queue}/groups`` and ``/api/admin/budgets``, and the dashboard pages that show them.

Group names and budget keys are user data: the pages escape them, the API never echoes a bad queue name.
"""

from __future__ import annotations

import httpx
import pytest
from dramatiq import Message
from markupsafe import escape

from conveyor.api import sessions
from conveyor.api.auth import COOKIE
from conveyor.brokers.base import EnqueueItem
from tests.support.obs_support import TOKEN, CliProcess, api_server, broker_app, cli_env, running
from tests.support.waiting import wait_for

AUTH = {"Authorization": f"Bearer {TOKEN}"}
HOSTILE = "<script>alert('group')</script>"
#: A group name at the enqueue's limit (MAX_GROUP_LENGTH).
LONG = "g" * 128
#: Named groups besides "a", HOSTILE and LONG: more than the queue page lists (GROUPS_SHOWN = 20).
SMALL = [f"t{n:02d}" for n in range(25)]


@pytest.fixture(params=["redis", "postgres"])
def app(request):
    app = broker_app(
        request,
        request.param,
        imports="tests.support.dashboard_jobs",
        database_url=request.getfixturevalue("database_url"),
    )
    yield app
    app.close()


@pytest.fixture
def api(app):
    with api_server(app) as url, httpx.Client(base_url=url, timeout=20) as client:
        yield client


def page(api, app, path: str) -> httpx.Response:
    cookie = sessions.open_session(app, "test")
    return api.get(path, headers={"Cookie": f"{COOKIE}={cookie}"})


def test_the_groups_of_a_queue_busiest_first_with_their_cap_escaped_and_counted(app, api):
    app.broker.pause_queue("tenants")  # nothing claims them: every job stays waiting
    for group in ["a", "a", "a", HOSTILE, HOSTILE, LONG, *SMALL]:
        app.jobs.enqueue("dash.work", {"tenant": "x"}, group=group)
    app.jobs.enqueue("dash.work", {"tenant": "x"})  # the default group: not listed

    response = api.get("/api/admin/queues/tenants/groups", headers=AUTH)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["queue"] == "tenants" and body["groupConcurrency"] == 1
    assert body["total"] == 28 and body["more"] == 0
    first = body["groups"][:3]
    assert [(g["group"], g["waiting"], g["active"]) for g in first] == [("a", 3, 0), (HOSTILE, 2, 0), (LONG, 1, 0)]
    assert all(0 <= g["oldestWaitingSeconds"] < 60 for g in body["groups"])

    top = api.get("/api/admin/queues/tenants/groups?limit=2", headers=AUTH).json()
    assert [g["group"] for g in top["groups"]] == ["a", HOSTILE] and (top["total"], top["more"]) == (28, 26)

    # The dashboard's queue page: the busiest 20, the rest counted, every name escaped.
    text = page(api, app, "/admin/queues/tenants").text
    assert str(escape(HOSTILE)) in text and HOSTILE not in text
    assert 'data-group="a"' in text and LONG in text
    assert "and 8 more groups" in text
    assert text.count("<tr data-group=") == 20


def test_groups_of_an_unknown_queue_are_404_without_the_name_and_the_routes_need_the_token(app, api):
    marker = "nosuch-q<b>7f3a"
    response = api.get(f"/api/admin/queues/{marker}/groups", headers=AUTH)
    assert response.status_code == 404
    assert "7f3a" not in response.text and "tenants" in response.text  # the known queues, not the input
    assert api.get("/api/admin/queues/tenants/groups?limit=0", headers=AUTH).status_code == 422
    assert api.get("/api/admin/queues/tenants/groups?limit=99999", headers=AUTH).status_code == 422
    for path in ("/api/admin/queues/tenants/groups", "/api/admin/budgets"):
        assert api.get(path).status_code == 401
        assert api.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    # A queue with no group at all: an empty list, its cap (none).
    empty = api.get("/api/admin/queues/metered/groups", headers=AUTH).json()
    assert (empty["groups"], empty["total"], empty["groupConcurrency"]) == ([], 0, None)
    assert 'id="groups-summary"' not in page(api, app, "/admin/queues/metered").text


def test_budgets_show_each_keys_use_and_what_they_throttled(app, api):
    tenant = "<b>tenant</b>"
    with running(app, "metered"):
        first = app.jobs.enqueue("dash.metered", {"tenant": tenant, "weight": 30})
        wait_for(lambda: app.jobs.get(first.id).state == "completed", timeout=30, message="the first job to run")
        # 30 of 50 taken: a second 30 does not fit the window and waits (throttled, RetryLater).
        app.jobs.enqueue("dash.metered", {"tenant": tenant, "weight": 30})
        app.jobs.enqueue("dash.metered", {"tenant": "small", "weight": 5})

        def tokens() -> dict | None:
            response = api.get("/api/admin/budgets", headers=AUTH)
            assert response.status_code == 200, response.text
            found = {b["name"]: b for b in response.json()}
            budget = found["dash-tokens"]
            return found if budget["throttled"] and len(budget["keys"]) == 2 else None

        found = wait_for(tokens, timeout=30, message="a throttled start and both keys in use")
    budget = found["dash-tokens"]
    assert (budget["limit"], budget["per"], budget["keyed"]) == (50, 30, True)
    assert sorted(budget["declaredBy"]) == ["job dash.metered", "job dash.work"]
    assert budget["keys"] == [{"key": tenant, "used": 30.0}, {"key": "small", "used": 5.0}]
    assert budget["totalKeys"] == 2 and not budget["unavailable"]
    assert budget["throttled"] >= 1 and budget["waitedSeconds"] > 0
    # The queue's own budget (tenants: nothing ran there) has no key and nothing taken.
    starts = found["dash-starts"]
    assert (starts["keyed"], starts["keys"], starts["declaredBy"]) == (False, [], ["queue tenants"])

    text = page(api, app, "/admin/budgets").text
    assert 'data-budget="dash-tokens"' in text and 'data-budget="dash-starts"' in text
    assert str(escape(tenant)) in text and tenant not in text
    assert "60 %" in text  # 30 of 50


def test_a_group_name_of_200_characters_does_not_break_the_queue_page(request, redis_url, database_url):
    """An older producer (or another client of the broker) may have stored a longer group than the enqueue
    allows: the page still renders it, escaped. On Redis only: Postgres refuses one past 128 characters."""
    app = broker_app(request, "redis", imports="tests.support.dashboard_jobs", database_url=database_url)
    try:
        app.broker.pause_queue("tenants")
        name = "<i>" + "w" * 197
        message = Message(queue_name="tenants", actor_name="dash.work", args=({},), kwargs={}, options={"group": name})
        app.broker.enqueue_jobs([EnqueueItem(message)], dedup_ttl=60)
        with api_server(app) as url, httpx.Client(base_url=url, timeout=20) as api:
            text = page(api, app, "/admin/queues/tenants").text
            assert str(escape(name)) in text and name not in text
            groups = api.get("/api/admin/queues/tenants/groups", headers=AUTH).json()["groups"]
        assert [g["group"] for g in groups] == [name]
    finally:
        app.close()


def test_throttles_counted_by_worker_processes_reach_the_budgets_through_the_metrics_directory(
    request, redis_url, database_url, clean_env, tmp_path
):
    """A real ``conveyor worker`` (supervisor and child) counts the throttle in PROMETHEUS_MULTIPROC_DIR;
    an API process given the same directory shows it, though its own process throttled nothing."""
    from conveyor.inspector import Inspector

    directory = tmp_path / "metrics"
    env = cli_env(
        clean_env,
        REDIS_URL=redis_url,
        CONVEYOR_BROKER="redis",
        CONVEYOR_IMPORTS="tests.support.dashboard_jobs",
        CONVEYOR_METRICS_PORT="0",
    )
    env["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    app = broker_app(request, "redis", imports="tests.support.dashboard_jobs", database_url=database_url)
    process = CliProcess(["worker", "--queues", "metered", "--processes", "1"], env, tmp_path / "worker.log")
    try:
        for _ in range(2):  # 30 + 30 of 50: the second waits
            app.jobs.enqueue("dash.metered", {"tenant": "t", "weight": 30})
        clean_env.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
        inspect = Inspector(app)

        def tokens():
            budget = next(b for b in inspect.budgets() if b.name == "dash-tokens")
            return budget if budget.throttled else None

        budget = wait_for(tokens, timeout=60, interval=0.2, message="the worker's throttle")
        assert budget.throttled == 1 and budget.waited_seconds > 0
        assert [(k.key, k.used) for k in budget.keys] == [("t", 30.0)]
    finally:
        process.stop()
        app.close()


def test_a_groups_weight_is_set_over_the_api_and_shown_on_the_groups_view(app, api):
    app.broker.pause_queue("tenants")
    for group in ["a", "a", HOSTILE]:
        app.jobs.enqueue("dash.work", {"tenant": "x"}, group=group)
    response = api.put("/api/admin/queues/tenants/groups/a/weight", json={"weight": 3}, headers=AUTH)
    assert response.status_code == 200, response.text
    assert {g["group"]: g["weight"] for g in response.json()["groups"]} == {"a": 3, HOSTILE: 1}
    # A group with no job yet takes a weight too (a tenant's share, set before its first job), by its path.
    quoted = "%3Cscript%3Ealert('group')%3C%2Fscript%3E"
    assert api.put(f"/api/admin/queues/tenants/groups/{quoted}/weight", json={"weight": 2}, headers=AUTH).is_success
    listed = api.get("/api/admin/queues/tenants/groups", headers=AUTH).json()["groups"]
    assert {g["group"]: g["weight"] for g in listed} == {"a": 3, HOSTILE: 2}
    assert app.jobs.group_weights("tenants") == {HOSTILE: 2, "a": 3}
    text = page(api, app, "/admin/queues/tenants").text
    assert ">Weight</th>" in text and '<td class="num group-weight">3</td>' in text


@pytest.mark.parametrize(
    "body",
    [{"weight": 0}, {"weight": 1001}, {"weight": "3"}, {"weight": 2.5}, {"weight": 3, "extra": 1}, {}, ["x7f3b"]],
)
def test_a_bad_weight_is_a_422_that_does_not_echo_it_and_the_route_needs_the_token(app, api, body):
    path = "/api/admin/queues/tenants/groups/a/weight"
    response = api.put(path, json=body, headers=AUTH)
    assert response.status_code == 422, response.text
    assert "x7f3b" not in response.text and "1001" not in response.text
    assert api.put(path, json={"weight": 2}).status_code == 401
    assert api.put(path, json={"weight": 2}, headers={"Authorization": "Bearer wrong"}).status_code == 401
    marker = "nosuch-q<b>7f3a"
    unknown = api.put(f"/api/admin/queues/{marker}/groups/a/weight", json={"weight": 2}, headers=AUTH)
    assert unknown.status_code == 404 and "7f3a" not in unknown.text
    assert app.jobs.group_weights("tenants") == {}, "nothing was stored"

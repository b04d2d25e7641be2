"""Resource ids are each user's own (migration 0062): no answer tells one user another's id exists, two users
may use one id, and resources made before the migration keep their owner, text and index."""

from __future__ import annotations

import httpx
import pytest

from conveyor.app import App
from conveyor.platform import records
from conveyor.platform.blueprint import jobs as platform
from conveyor.schema import migrate as migrator
from conveyor.settings import Settings
from tests.support.platform_support import serve, user_key, workers
from tests.support.waiting import wait_for


@pytest.fixture
def app(redis_url, database_url):
    app = App(Settings(broker="redis", redis_url=redis_url, database_url=database_url))
    yield app
    app.close()


def test_two_users_use_one_resource_id_and_no_answer_tells_one_of_the_others(app):
    alice, bob = user_key(app, "alice"), user_key(app, "bob")
    with serve(app) as base, httpx.Client(base_url=base, timeout=30) as client, workers(app, ("indexing",)):
        assert client.put("/api/resources/plan", json={"body": "alice plans kafka"}, headers=alice).status_code == 202
        # Bob asks for alice's id and for one nobody has: the same answers, to the byte.
        for method, body in (("GET", None), ("PUT", {"body": "bob plans zookeeper"})):
            taken = client.request(method, "/api/resources/plan", json=body, headers=bob)
            free = client.request(method, "/api/resources/free", json=body, headers=bob)
            assert taken.status_code == free.status_code, (method, taken.text, free.text)
            assert taken.json().keys() == free.json().keys()
            if method == "GET":
                assert taken.json() == free.json() == {"detail": "no such resource"}
            else:
                assert taken.json()["deduplicated"] is free.json()["deduplicated"] is False
        for who, rid in ((alice, "plan"), (bob, "plan"), (bob, "free")):
            wait_for(
                lambda who=who, rid=rid: client.get(f"/api/resources/{rid}", headers=who).json()["indexed"],
                timeout=30,
                message="indexed",
            )
        # Each finds their own text under the one id, and only their own.
        mine = client.get("/api/resources/search", params={"q": "plans"}, headers=alice).json()["results"]
        his = client.get("/api/resources/search", params={"q": "plans"}, headers=bob).json()["results"]
        assert [(h["resource_id"], "kafka" in h["snippet"]) for h in mine] == [("plan", True)]
        assert sorted((h["resource_id"], "zookeeper" in h["snippet"]) for h in his) == [("free", True), ("plan", True)]


def test_resources_made_before_the_migration_keep_their_owner_and_index(make_database, monkeypatch):
    url = make_database()
    every = migrator.migration_files([platform])
    before = [path for path in every if path.name < "0062"]
    with monkeypatch.context() as patched:
        patched.setattr(migrator, "migration_files", lambda *_: before)
        migrator.migrate(url, [platform])
    with App(Settings(broker="postgres", database_url=url)).pool.connection() as conn:
        conn.execute(
            "INSERT INTO resources (id, user_id, title, body, version) VALUES ('doc', 'carol', 't', 'old words', 'v1')"
        )
        conn.execute(
            "INSERT INTO resource_chunks (resource_id, seq, version, body) VALUES ('doc', 1, 'v1', 'old words')"
        )
    assert migrator.migrate(url, [platform]) == [p.name for p in every if p.name >= "0062"]
    app = App(Settings(broker="postgres", database_url=url))
    try:
        with app.pool.connection() as conn:
            assert records.get_resource_of(conn, "doc", "carol").body == "old words"
            assert [h.resource_id for h in records.search_resources(conn, "words", user_id="carol")] == ["doc"]
            records.upsert_resource(conn, id="doc", user_id="dave", task_id=None, title="", body="new words")
            assert records.get_resource_of(conn, "doc", "dave").body == "new words"
            assert records.get_resource_of(conn, "doc", "carol").body == "old words"
            # A job enqueued before the migration names the id alone: it finds the resource it was for.
            assert records.lock_resource(conn, "doc").user_id == "carol"
    finally:
        app.close()

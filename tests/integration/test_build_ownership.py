"""Two users racing on one new agent id: no build is ever recorded against another user's agent.

The ownership check and the agent's creation are one statement in the build's own transaction
(``store.create_build``), so the loser of the race is answered 404, as for an agent that is not
theirs, and nothing of its request is kept. Raced over many rounds, over the real HTTP API and on
the store functions the CLI and the admin token use.
"""

from __future__ import annotations

import threading
from collections import Counter

import httpx
import pytest

from conveyor.app import App
from conveyor.errors import RecordNotFound
from conveyor.platform.builds.requests import request_build
from conveyor.settings import Settings
from tests.support.obs_support import TOKEN
from tests.support.platform_support import serve, user_key

#: Rounds of each race: the issue saw 41 of 60 rollback races go wrong, so 60 catch it at once.
ROUNDS = 60


@pytest.fixture
def app(redis_url, database_url):
    app = App(Settings(broker="redis", redis_url=redis_url, database_url=database_url, admin_token=TOKEN))
    yield app
    app.close()


def cross_owner_builds(app: App) -> list[tuple[str, str, str]]:
    """(build, its owner, its agent's owner) of every build recorded against another user's agent."""
    with app.pool.connection() as conn:
        rows = conn.execute(
            "SELECT b.id, b.owner_id, a.owner_id FROM builds b JOIN agents a ON a.id = b.agent_id"
            " WHERE a.owner_id <> b.owner_id"
        ).fetchall()
    return [tuple(row) for row in rows]


def race(*calls) -> list[object]:
    """Run ``calls`` at once (released together by a barrier); their results or exceptions, in order."""
    barrier = threading.Barrier(len(calls))
    results: list[object] = [None] * len(calls)

    def run(n: int) -> None:
        barrier.wait()
        try:
            results[n] = calls[n]()
        except Exception as exc:  # noqa: BLE001 (the race's outcome, asserted by the caller)
            results[n] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def test_two_users_racing_on_a_new_agent_id_never_build_on_each_others_agent(app):
    alice, bob = user_key(app, "alice"), user_key(app, "bob")
    answers: Counter[int] = Counter()
    with serve(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        for n in range(ROUNDS):
            body = {"kind": "rollback", "agent_id": f"race-{n}", "target_version": "v1"}
            for answer in race(
                lambda: client.post("/api/builds", json=body, headers=alice),
                lambda: client.post("/api/builds", json=body, headers=bob),
            ):
                assert isinstance(answer, httpx.Response)
                answers[answer.status_code] += 1
    assert cross_owner_builds(app) == []
    assert set(answers) <= {202, 404}, answers


#: Every build request's kind, with fields that pass validation (no worker runs them), by target table.
UPLOAD = "upl_" + "0" * 32
KINDS = {
    "upload": ("agent", {"upload_id": UPLOAD}),
    "update": ("agent", {"upload_id": UPLOAD}),
    "rollback": ("agent", {"target_version": "v1"}),
    "standalone_build": ("agent", {"git_url": "https://example.com/a.git"}),
    "github_clone": ("agent", {"repo_url": "https://example.com/a.git"}),
    "mcp_upload": ("connector", {"source": {"type": "upload", "upload_id": UPLOAD}}),
}


def cross_owner_builds_of(app: App, table: str) -> list[tuple[str, str, str]]:
    column = "agent_id" if table == "agent" else "connector_id"
    with app.pool.connection() as conn:
        rows = conn.execute(
            f"SELECT b.id, b.owner_id, t.owner_id FROM builds b JOIN {table}s t ON t.id = b.{column}"
            " WHERE t.owner_id <> b.owner_id"
        ).fetchall()
    return [tuple(row) for row in rows]


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_store_checks_the_owner_in_the_builds_own_transaction(app, kind):
    """The same race on ``request_build`` (the CLI's and the admin token's way in, which name raw ids)."""
    table, fields = KINDS[kind]
    outcomes: Counter[str] = Counter()
    for n in range(ROUNDS):
        target = {f"{table}_id": f"raw-{kind}-{n}", **fields}
        results = race(
            *(
                (lambda owner=owner: request_build(app, kind, {**target, "owner_id": owner}))
                for owner in ("alice", "bob")
            )
        )
        assert all(isinstance(r, RecordNotFound) or hasattr(r, "build_id") for r in results), results
        # One of the two got the target, the other was told it does not exist.
        outcomes["".join(sorted("won" if hasattr(r, "build_id") else "404" for r in results))] += 1
    assert cross_owner_builds_of(app, table) == []
    assert outcomes == {"404won": ROUNDS}, outcomes

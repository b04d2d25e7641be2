"""Weighted fair shares (issue 21.2) at the broker's own claim, on postgres and redis: with backlogs in
three groups of weights 3, 2 and 1, the claims come out 3:2:1, in claims of any size, and with two
claimers at once on Postgres (the second claimer's group rows may be skipped: SKIP LOCKED, so its picks
are counted a little late; the shares still hold). The contract suite (tests/contract/test_groups.py)
has the turns one by one, the settings' precedence and the idle group that banks nothing."""

from __future__ import annotations

import json
import threading
from collections import Counter

import pytest

from conveyor.app import App
from conveyor.tasks.jobqueue import JobRequest
from tests.support.harness import make_settings

QUEUE = "indexing"
WEIGHTS = {"gold": 3, "silver": 2, "bronze": 1}
BACKLOG = 400  # each: none runs out within the claims counted
TAKEN = 600


@pytest.fixture(params=["postgres", "redis"])
def app(request, clean_env, database_url):
    redis_url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    app = App(make_settings(request.param, redis_url, database_url))
    for group, weight in WEIGHTS.items():
        app.jobs.set_group_weight(QUEUE, group, weight)
    app.jobs.enqueue_many(
        [JobRequest(f"test.probe.{QUEUE}", {"token": g}, group=g) for _ in range(BACKLOG) for g in WEIGHTS]
    )
    yield app
    app.close()


def claim(app: App, limit: int) -> list[str]:
    """One claim of up to ``limit`` jobs by the broker's consumer call; the groups of the jobs it took."""
    broker = app.broker
    if app.settings.broker_name == "postgres":
        texts = [r[4] for r in broker.jobs.claim(QUEUE, limit, synchronous=True)]  # type: ignore[attr-defined]
    else:
        texts = [r[1] for r in broker.fetch(QUEUE, limit)]  # type: ignore[attr-defined]
    return [json.loads(t)["args"][0]["token"] for t in texts]


def shares(counts: Counter[str]) -> tuple[float, float]:
    """gold and silver per bronze."""
    return counts["gold"] / counts["bronze"], counts["silver"] / counts["bronze"]


@pytest.mark.parametrize("limit", [1, 4, 16])
def test_weights_3_2_1_with_backlogs_in_all_three_give_claims_3_2_1(app, limit):
    counts: Counter[str] = Counter()
    while sum(counts.values()) < TAKEN:
        got = claim(app, limit)
        assert got, f"a claim found nothing with {sum(counts.values())} of {TAKEN} taken"
        counts.update(got)
    gold, silver = shares(counts)
    assert 2.7 <= gold <= 3.3 and 1.8 <= silver <= 2.2, counts


# Postgres only: on Redis one Lua script runs at a time, so two claims never overlap.
@pytest.mark.parametrize("app", ["postgres"], indirect=True)
def test_two_claimers_at_once_keep_the_shares(app):
    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def run() -> None:
        for _ in range(TAKEN // 8):
            got = claim(app, 4)
            with lock:
                counts.update(got)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    gold, silver = shares(counts)
    assert 2.4 <= gold <= 3.6 and 1.6 <= silver <= 2.4, counts

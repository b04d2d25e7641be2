"""Per-user quotas over the real API: runs going at once, open SSE streams and stream data kept each answer
429 past their limit (naming it, echoing nothing) and free again when a run ends, a stream closes, or old
streams age out; a place held by an API process that died is given back when its lease runs out. An open
stream waits on a wake-up from its store (XREAD BLOCK, LISTEN), not a poll."""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx
import pytest
import redis

from conveyor.app import App
from conveyor.platform import quotas, records
from conveyor.platform.settings import PlatformSettings, platform_settings
from conveyor.platform.streams import buffer_for
from conveyor.settings import Settings
from tests.support.platform_support import completed_round, make_task, parse_sse, serve, user_key
from tests.support.waiting import wait_for

SECRET = "hunter2-do-not-echo"


def quota_app(broker: str, redis_url: str, database_url: str, **quotas) -> App:
    """An App whose platform has the per-user ``quotas`` given (the platform's settings)."""
    return App(
        Settings(broker=broker, redis_url=redis_url, database_url=database_url),
        blueprint_settings=[PlatformSettings(**quotas)],
    )


@pytest.fixture
def app(redis_url, database_url):
    app = quota_app("redis", redis_url, database_url, user_max_active_runs=3, user_max_streams=2)
    yield app
    app.close()


def post_run(client: httpx.Client, task_id: str, headers) -> httpx.Response:
    return client.post(f"/api/tasks/{task_id}/runs", json={"content": SECRET}, headers=headers)


def assert_quota_answer(answer: httpx.Response, setting: str) -> None:
    answer.read()  # a streamed request's answer too
    assert answer.status_code == 429, answer.text
    assert setting in answer.json()["detail"] and SECRET not in answer.text


def test_runs_going_at_once_are_capped_per_user_and_free_when_one_ends(app):
    """No workers: every run stays queued. Ten racing POSTs of one user get exactly three places."""
    make_task(app, "t-alice", user_id="alice")
    make_task(app, "t-bob", user_id="bob")
    alice, bob = user_key(app, "alice"), user_key(app, "bob")
    with serve(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        answers: list[httpx.Response] = []
        barrier = threading.Barrier(10)

        def post() -> None:
            barrier.wait()
            answers.append(post_run(client, "t-alice", alice))

        threads = [threading.Thread(target=post) for _ in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert Counter(a.status_code for a in answers) == {202: 3, 429: 7}
        assert_quota_answer(next(a for a in answers if a.status_code == 429), "CONVEYOR_USER_MAX_ACTIVE_RUNS")
        with app.pool.connection() as conn:  # a refused run kept nothing, not even its message
            assert conn.execute("SELECT count(*) FROM messages WHERE task_id = 't-alice'").fetchone()[0] == 3
        assert post_run(client, "t-bob", bob).status_code == 202  # another user's places are their own
        # One run ends: its place is free again.
        accepted = [a.json()["run_id"] for a in answers if a.status_code == 202]
        with app.pool.connection() as conn:
            records.fail_run(conn, accepted[0], "gave up")
        assert post_run(client, "t-alice", alice).status_code == 202
        assert_quota_answer(post_run(client, "t-alice", alice), "CONVEYOR_USER_MAX_ACTIVE_RUNS")


def test_stream_data_kept_is_capped_per_user_and_frees_as_streams_age_out(redis_url, database_url):
    app = quota_app("redis", redis_url, database_url, user_max_stream_bytes=1000)
    try:
        completed_round(app, task_id="t-big", user_id="carol", question="q", answer="x" * 1000)
        make_task(app, "t-carol", user_id="carol")
        make_task(app, "t-dave", user_id="dave")
        carol, dave = user_key(app, "carol"), user_key(app, "dave")
        with serve(app) as base, httpx.Client(base_url=base, timeout=30) as client:
            assert_quota_answer(post_run(client, "t-carol", carol), "CONVEYOR_USER_MAX_STREAM_BYTES")
            assert post_run(client, "t-dave", dave).status_code == 202
            # The big stream ended longer ago than the retention: no longer kept, no longer counted.
            with app.pool.connection() as conn:
                conn.execute(
                    "UPDATE runs SET finished_at = now() - make_interval(secs => %s + 1) WHERE id = 't-big-run'",
                    (platform_settings(app).stream_retention,),
                )
            assert post_run(client, "t-carol", carol).status_code == 202
    finally:
        app.close()


def open_stream(client: httpx.Client, run_id: str, headers) -> tuple[httpx.Response, object]:
    """An open SSE response and its line iterator (the caller closes it), once its first event arrived."""
    response = client.send(client.build_request("GET", f"/api/runs/{run_id}/stream", headers=headers), stream=True)
    lines = response.iter_lines()
    if response.status_code == 200:
        assert next(lines).startswith("retry:")
    return response, lines


def test_open_streams_are_capped_per_user_and_free_on_close_or_when_a_dead_process_lease_runs_out(app):
    make_task(app, "t-erin", user_id="erin")
    erin = user_key(app, "erin")
    with serve(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        run_id = post_run(client, "t-erin", erin).json()["run_id"]
        # (each line iterator kept: one collected would close its response)
        first, first_lines = open_stream(client, run_id, erin)
        second, second_lines = open_stream(client, run_id, erin)
        third, _ = open_stream(client, run_id, erin)
        assert_quota_answer(third, "CONVEYOR_USER_MAX_STREAMS")
        third.close()
        first.close()  # the client hangs up: its place comes back
        probes = []
        wait_for(
            lambda: probes.append(open_stream(client, run_id, erin)) or probes[-1][0].status_code == 200,
            timeout=10,
            message="place back",
        )
        # (the probe's stream is left open: erin holds two again)
        second.close()
        # A place held by an API process that died: nobody renews or closes it; its lease runs out.
        with app.pool.connection() as conn:
            wait_for(
                lambda: conn.execute("SELECT count(*) FROM stream_leases").fetchone()[0] == 1,
                timeout=10,
                message="second stream's lease given back",
            )
            quotas.open_stream(conn, "erin", run_id, limit=2, lease=60)  # a dead process's: never closed
        assert_quota_answer(open_stream(client, run_id, erin)[0], "CONVEYOR_USER_MAX_STREAMS")
        with app.pool.connection() as conn:  # its lease runs out (on the database's clock)
            conn.execute("UPDATE stream_leases SET expires_at = now() - interval '1 second' WHERE user_id = 'erin'")
        assert open_stream(client, run_id, erin)[0].status_code == 200
        for response, _ in probes:
            response.close()


def redis_stream_reads(client) -> int:
    stats = client.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("xrange", "xread"))


def postgres_stream_reads(app: App) -> int:
    with app.pool.connection() as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'run_chunks'"
        ).fetchone()
    return int(row[0])


@pytest.mark.parametrize("broker", ["redis", "postgres"])
def test_an_open_stream_waits_on_a_wake_up_not_a_poll(broker, redis_url, database_url):
    app = quota_app(broker, redis_url, database_url)
    try:
        make_task(app, "t-fay", user_id="fay")
        fay = user_key(app, "fay")
        buffer = buffer_for(app)
        with serve(app) as base, httpx.Client(base_url=base, timeout=30) as client:
            run_id = post_run(client, "t-fay", fay).json()["run_id"]  # no worker: only the test writes its stream
            response, lines = open_stream(client, run_id, fay)
            events = parse_sse(lines)
            try:
                if broker == "redis":
                    counter = redis.Redis.from_url(redis_url)
                    reads = lambda: redis_stream_reads(counter)  # noqa: E731
                else:
                    reads = lambda: postgres_stream_reads(app)  # noqa: E731
                before = reads()
                time.sleep(2)  # idle: a 0.1 s poll would read the stream ~20 times
                idle_reads = reads() - before
                assert idle_reads <= 4, idle_reads
                # A chunk reaches the reader at once: a wake-up, not the next tick of a timer.
                latencies = []
                for seq in (1, 2, 3):
                    sent = time.monotonic()
                    buffer.append(run_id, seq, f"chunk {seq}")
                    event = next(events)
                    latencies.append(time.monotonic() - sent)
                    assert (event["event"], event["id"]) == ("chunk", str(seq))
                assert max(latencies) < 1.0, latencies  # the idle wait is 2 s: only a wake-up is faster
            finally:
                response.close()
    finally:
        app.close()


def test_a_run_quota_check_waits_for_another_request_of_that_user_taking_the_last_place(app):
    """The count and the run's row are one transaction under a per-user lock: a second request that counts
    while the first has counted but not yet written waits for it, then finds no room."""
    make_task(app, "t-gus", user_id="gus")
    gus = user_key(app, "gus")
    with serve(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        for _ in range(2):
            assert post_run(client, "t-gus", gus).status_code == 202
        answer: list[httpx.Response] = []
        with app.pool.connection() as conn, conn.transaction():
            quotas.check_new_run(conn, "gus", quotas.RunQuota.of(platform_settings(app)))  # the last place: counted ...
            second = threading.Thread(target=lambda: answer.append(post_run(client, "t-gus", gus)))
            second.start()
            second.join(1.0)  # ... and the other request, meanwhile, waits (it would have its 202 by now)
            assert answer == []
            records.add_message(conn, id="gus-m", task_id="t-gus", role="user", content="q")
            records.create_run(
                conn,
                id="gus-run",
                task_id="t-gus",
                job="chat.run",
                user_message_id="gus-m",
                assistant_message_id="gus-a",
            )
        second.join(30)
        assert_quota_answer(answer[0], "CONVEYOR_USER_MAX_ACTIVE_RUNS")

"""The Redis broker under faults: outages, timeouts, reconnects, lying clocks, superseded deliveries.

Each test runs against a private redis-server with an append-only file
(``appendfsync always``), killed and restarted the way it crashes, so what
Redis acknowledged survives the restart, as in production.
"""

from __future__ import annotations

import os
import tempfile
import time

import pytest
import redis
from dramatiq import Message

from conveyor.app import App
from conveyor.errors import BrokerUnavailable, EnqueueOutcomeUnknown
from conveyor.tasks.worker import ProcessWorker
from tests.support.harness import ROOT, make_settings, probe_dead, probe_runs, running
from tests.support.proxy import ReplyDroppingProxy
from tests.support.servers import RedisServer
from tests.support.waiting import wait_for

QUEUE = "critical"
JOB = f"test.probe.{QUEUE}"


@pytest.fixture(scope="module")
def durable_redis():
    with RedisServer(tempfile.mkdtemp(prefix="conveyor-redis-faults-"), durable=True) as server:
        yield server


@pytest.fixture
def redis_at(durable_redis, clean_env):
    if not durable_redis.is_running:
        durable_redis.start()
    client = redis.Redis.from_url(durable_redis.url)
    client.flushall()
    client.close()
    return durable_redis


@pytest.fixture
def make_app(redis_at, database_url):
    apps = []

    def make(redis_url: str | None = None, **overrides) -> App:
        app = App(make_settings("redis", redis_url or redis_at.url, database_url, **overrides))
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


@pytest.fixture
def settings(redis_at, database_url):
    """For the ``workers`` fixture: worker subprocesses on the durable Redis."""
    return make_settings("redis", redis_at.url, database_url)


@pytest.fixture
def client(redis_at):
    c = redis.Redis.from_url(redis_at.url)
    yield c
    c.close()


def _outage(server: RedisServer, seconds: float) -> tuple[float, float]:
    """SIGKILL Redis, keep it down ``seconds``, start it again on the same files; returns (down, up) times."""
    down = time.time()
    server.kill()
    time.sleep(seconds)
    server.start()
    return down, time.time()


def _next_message(consumer, timeout: float = 10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = next(consumer)
        if message is not None:
            return message
    raise AssertionError("no message fetched")


def _acks_members(client: redis.Redis, ns: str) -> set[bytes]:
    members = set()
    for key in client.scan_iter(match=f"{ns}:__acks__.*"):
        members |= client.smembers(key)
    return members


# -- 1. a start or an outcome that cannot be written ------------------------------


def test_retry_of_a_job_that_fails_while_redis_is_down_is_not_lost(make_app, redis_at, database_url):
    app = make_app(heartbeat_timeout=30)
    ref = app.jobs.enqueue(JOB, {"token": "blip-retry", "sleep": 1.5, "fail_times": 1})
    with running(app, QUEUE):
        wait_for(lambda: probe_runs(database_url, "blip-retry"), message="the job to start")
        _outage(redis_at, 3)  # the job fails while Redis is down: its retry cannot be written then
        wait_for(
            lambda: app.broker.get_job(ref.id).state == "completed",
            timeout=60,
            message="the job to complete after its retry",
        )
    runs = probe_runs(database_url, "blip-retry")
    assert [r["attempt"] for r in runs] == [1, 2], "the failed attempt must be retried, not acked as completed"
    assert runs[1]["finished_at"] is not None
    assert app.broker.get_job(ref.id).attempts == 2


def test_a_job_whose_start_cannot_be_written_does_not_run_until_it_can(make_app, redis_at, database_url):
    app = make_app(heartbeat_timeout=30)
    first = app.jobs.enqueue(JOB, {"token": "blip-start-1", "sleep": 2})
    second = app.jobs.enqueue(JOB, {"token": "blip-start-2"})
    worker = ProcessWorker(app, QUEUE, threads=1)  # the second job waits, prefetched, for the one thread
    worker.start()
    try:
        wait_for(lambda: probe_runs(database_url, "blip-start-1"), message="the first job to start")
        down, up = _outage(redis_at, 4)
        wait_for(
            lambda: app.broker.get_job(second.id).state == "completed",
            timeout=60,
            message="the second job to run once Redis is back",
        )
    finally:
        worker.stop()
    runs = probe_runs(database_url, "blip-start-2")
    assert len(runs) == 1
    assert runs[0]["started_at"].timestamp() >= up - 0.5, "it ran while its start could not be written"
    assert app.broker.get_job(second.id).attempts == 1
    assert app.broker.get_job(first.id).state == "completed"


# -- 2. client settings and timeouts ------------------------------------------------


def test_redis_client_settings_reach_the_connection_pool(make_app):
    app = make_app(redis_socket_timeout=1.5, redis_connect_timeout=2.5, redis_health_check_interval=7, redis_retries=2)
    kwargs = app.broker.client.connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"], kwargs["health_check_interval"]) == (
        1.5,
        2.5,
        7,
    )
    assert kwargs["retry"].get_retries() == 2


def test_a_final_failure_that_times_out_is_written_later_and_its_hook_runs_once(make_app, client, database_url):
    # Replies take longer than the socket timeout while Redis is paused: timeouts, not connection errors.
    app = make_app(redis_socket_timeout=1, redis_retries=0, heartbeat_timeout=30)
    reader = make_app()  # the test's own reads wait out the pause
    ref = app.jobs.enqueue(JOB, {"token": "paused-nack", "sleep": 1, "permanent": True})
    with running(app, QUEUE):
        wait_for(lambda: probe_runs(database_url, "paused-nack"), message="the job to start")
        client.execute_command("CLIENT", "PAUSE", 3500, "ALL")
        wait_for(
            lambda: reader.broker.get_job(ref.id).state == "failed",
            timeout=60,
            message="the failure to be written once Redis answers",
        )
        wait_for(lambda: probe_dead(database_url), timeout=30, message="the final-failure hook")
    assert [d["token"] for d in probe_dead(database_url)] == ["paused-nack"]
    assert len(probe_runs(database_url, "paused-nack")) == 1


def test_recovery_never_scans_the_keyspace_with_keys(make_app, client):
    dead, live = make_app(), make_app()
    dead.jobs.enqueue(JOB, {"token": "keys"})
    consumer = dead.broker.consume(QUEUE, prefetch=1, timeout=100)
    _next_message(consumer)
    client.zadd(f"{dead.settings.redis_namespace}:__heartbeats__", {dead.broker.broker_id: 0})
    client.config_resetstat()
    recovered = live.broker.maintain()
    calls = client.info("commandstats")
    assert "cmdstat_keys" not in calls, "recovery ran KEYS over the whole keyspace"
    assert sum(len(v) for v in recovered.values()) == 1


# -- 3. delayed jobs held by a consumer that was replaced -------------------------------


def test_delayed_job_held_by_a_replaced_consumer_runs_while_its_worker_lives(make_app, redis_at, database_url):
    app = make_app(heartbeat_timeout=3600)  # recovery of dead workers cannot be what brings it back
    ns = app.settings.redis_namespace
    with running(app, QUEUE):
        ref = app.jobs.enqueue(JOB, {"token": "stranded"}, delay=3)
        with redis.Redis.from_url(redis_at.url) as c:
            wait_for(lambda: _acks_members(c, ns), message="the delay-queue consumer to fetch the delayed job")
        # Longer than the client's reconnect retries: the consumers fail and Dramatiq replaces them.
        _outage(redis_at, 4)
        wait_for(
            lambda: app.broker.get_job(ref.id).state == "completed",
            timeout=30,
            message="the delayed job to run while its worker lives",
        )
    assert len(probe_runs(database_url, "stranded")) == 1
    with redis.Redis.from_url(redis_at.url) as c:
        assert not _acks_members(c, ns), "a stopped worker holds nothing"


def test_graceful_stop_hands_back_every_job_it_did_not_finish(make_app, redis_at):
    app = make_app(heartbeat_timeout=3600)
    ns = app.settings.redis_namespace
    later = app.jobs.enqueue(JOB, {"token": "later"}, delay=3600)
    worker = ProcessWorker(app, QUEUE)
    worker.start()
    client = redis.Redis.from_url(redis_at.url)
    try:
        wait_for(lambda: _acks_members(client, ns), message="the delayed job to be fetched")
        _outage(redis_at, 4)
        time.sleep(4)  # the replaced consumers are back
    finally:
        worker.stop()
    assert not _acks_members(client, ns)
    assert client.llen(f"{ns}:{QUEUE}.DQ") == 1
    assert app.broker.get_job(later.id).state == "delayed"
    client.close()


def test_a_fetch_whose_reply_was_lost_is_handed_back_by_the_release_pass(make_app, client):
    app = make_app(heartbeat_timeout=3600)
    ns = app.settings.redis_namespace
    ref = app.jobs.enqueue(JOB, {"token": "lost-reply"})
    consumer = app.broker.consume(QUEUE, prefetch=1, timeout=100)
    app.broker.jobs.call("fetch", QUEUE, 1)  # Redis did it; the reply never reached the consumer
    assert app.broker.get_job(ref.id).state == "active"
    assert app.broker.release_orphans() == {QUEUE: [ref.id]}
    assert app.broker.get_job(ref.id).state == "waiting"
    assert client.lrange(f"{ns}:{QUEUE}", 0, -1)
    message = _next_message(consumer)
    assert app.broker.start_job(message) == 1
    consumer.close()


# -- 4. server clock and the delivery fence ----------------------------------------------


def test_a_worker_whose_clock_is_an_hour_behind_is_not_declared_dead_while_it_works(
    make_app, workers, database_url, tmp_path
):
    app = make_app()
    ref = app.jobs.enqueue(JOB, {"token": "skewed", "sleep": 5})
    # The worker's wall clock (time.time, all the broker could read) runs an hour behind the server's.
    (tmp_path / "skew").mkdir()
    (tmp_path / "skew" / "sitecustomize.py").write_text(
        "import time\n_real, _real_ns = time.time, time.time_ns\n"
        "time.time = lambda: _real() - 3600\ntime.time_ns = lambda: _real_ns() - 3600 * 10**9\n"
    )
    worker = workers(QUEUE, PYTHONPATH=f"{tmp_path / 'skew'}{os.pathsep}{ROOT}")
    wait_for(lambda: probe_runs(database_url, "skewed"), timeout=60, message="the skewed worker to start the job")
    recovered = []
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and app.broker.get_job(ref.id).state != "completed":
        recovered += app.broker.maintain().get(QUEUE, [])
        time.sleep(0.2)
    wait_for(lambda: app.broker.get_job(ref.id).state == "completed", timeout=60, message="the job to complete")
    assert recovered == [], "a heartbeating worker was declared dead"
    assert len(probe_runs(database_url, "skewed")) == 1
    worker.terminate()


def test_a_superseded_delivery_can_neither_start_nor_settle_the_next_one(make_app):
    a, b = make_app(), make_app()
    ref = a.jobs.enqueue(JOB, {"token": "fenced"})
    old = _next_message(a.broker.consume(QUEUE, prefetch=1, timeout=100))
    time.sleep(a.settings.heartbeat_timeout + 0.5)  # a says nothing for longer than the heartbeat timeout
    assert b.broker.maintain() == {QUEUE: [ref.id]}
    consumer_b = b.broker.consume(QUEUE, prefetch=1, timeout=100)
    new = _next_message(consumer_b)  # the real second delivery
    assert new.options["redis_delivery"] > old.options["redis_delivery"]
    assert a.broker.start_job(old) == 0, "the superseded delivery must not start"
    assert b.broker.start_job(new) == 1
    a_consumer = a.broker.consume(QUEUE, prefetch=1, timeout=100)
    a_consumer.ack(old)
    a.broker.acks.flush()
    assert a.broker.get_job(ref.id).state == "active", "the late ack of the old delivery was applied"
    old.fail()
    a_consumer.nack(old)
    assert a.broker.get_job(ref.id).state == "active", "the late failure of the old delivery was applied"
    assert a.broker.claim_final_failure(old) is False
    consumer_b.ack(new)
    b.broker.acks.flush()
    record = b.broker.get_job(ref.id)
    assert (record.state, record.attempts) == ("completed", 1)


# -- 5. promotion, older producers, configuration --------------------------------------------


def test_a_delayed_job_promoted_by_a_worker_that_died_before_its_ack_runs_once(make_app, client, database_url):
    a, b = make_app(), make_app()
    ns = a.settings.redis_namespace
    a.jobs.enqueue(JOB, {"token": "promoted"}, delay=0.2)
    held = _next_message(a.broker.consume(f"{QUEUE}.DQ", prefetch=1, timeout=100))
    due = held.copy(queue_name=QUEUE)
    del due.options["eta"]
    a.broker.enqueue(due)  # the promotion; the worker dies before it acks the delay queue
    with running(b, QUEUE):
        wait_for(
            lambda: not client.zscore(f"{ns}:__heartbeats__", a.broker.broker_id),
            timeout=30,
            message="the dead worker to be recovered",
        )
        wait_for(
            lambda: (
                client.llen(f"{ns}:{QUEUE}.DQ") == client.llen(f"{ns}:{QUEUE}") == 0
                and not _acks_members(client, ns)
                and all(r["finished_at"] for r in probe_runs(database_url, "promoted"))
            ),
            timeout=30,
            message="every copy of the job to have run",
        )
    assert len(probe_runs(database_url, "promoted")) == 1


def test_a_message_from_an_older_producer_runs_once_and_ends(make_app, client, database_url):
    app = make_app()
    ns = app.settings.redis_namespace
    message = Message(queue_name=QUEUE, actor_name=JOB, args=({"token": "old-producer"},), kwargs={}, options={})
    client.hset(f"{ns}:{QUEUE}.msgs", "old-rid", message.encode())  # no redis_message_id, no job record
    client.rpush(f"{ns}:{QUEUE}", "old-rid")
    with running(app, QUEUE):
        wait_for(
            lambda: (r := app.broker.get_job(message.message_id)) and r.state == "completed",
            timeout=30,
            message="the older producer's job to complete",
        )
    with running(app, QUEUE):  # a restart must not run it again
        time.sleep(0.5)
    assert len(probe_runs(database_url, "old-producer")) == 1
    assert not _acks_members(client, ns)
    assert not client.hexists(f"{ns}:{QUEUE}.msgs", "old-rid")


def test_redis_without_persistence_or_with_eviction_is_named(database_url, clean_env):
    with RedisServer(tempfile.mkdtemp(prefix="conveyor-redis-volatile-")) as volatile:
        app = App(make_settings("redis", volatile.url, database_url))
        try:
            c = redis.Redis.from_url(volatile.url)
            c.config_set("maxmemory-policy", "allkeys-lru")
            c.close()
            warnings = app.broker.config_warnings()
            assert len(warnings) == 2
            assert any("appendonly no" in w for w in warnings)
            assert any("allkeys-lru" in w for w in warnings)
            from conveyor.middleware.metrics import QueueCollector

            families = {f.name: f for f in QueueCollector(app).collect()}
            samples = {s.labels["reason"]: s.value for s in families["conveyor_broker_config_warning"].samples}
            assert samples == {"no_persistence": 1, "eviction_policy": 1}
        finally:
            app.close()
        # The dashboard's banner, over real HTTP.
        import httpx

        from conveyor.api import sessions
        from conveyor.api.auth import COOKIE
        from tests.support.obs_support import api_server, redis_app

        dashboard_app = redis_app(volatile.url)
        try:
            with api_server(dashboard_app) as url:
                cookie = sessions.open_session(dashboard_app, "test")  # a signed-in operator's session
                page = httpx.get(f"{url}/admin/queues", headers={"Cookie": f"{COOKIE}={cookie}"}, timeout=10)
            assert page.status_code == 200
            assert page.text.count('class="config-warning"') == 2 and "allkeys-lru" in page.text
        finally:
            dashboard_app.close()


def test_a_persistent_noeviction_redis_has_no_warning(make_app):
    assert make_app().broker.config_warnings() == []


# -- 6. the drain: a prefetched job handed back reads waiting, one that is not reads active ----------


def test_a_prefetched_job_reads_active_until_handed_back(make_app, client):
    app = make_app()
    ref = app.jobs.enqueue(JOB, {"token": "prefetched"})
    consumer = app.broker.consume(QUEUE, prefetch=1, timeout=100)
    message = _next_message(consumer)
    assert app.broker.get_job(ref.id).state == "active", "a fetched job must not read waiting"
    consumer.requeue([message])
    assert app.broker.get_job(ref.id).state == "waiting"
    assert not _acks_members(client, app.settings.redis_namespace)


def test_threads_see_one_consistent_hold_count(make_app):
    """The prefetch room counts what this process holds across consumers (a replaced one's in-flight jobs too)."""
    app = make_app()
    for i in range(4):
        app.jobs.enqueue(JOB, {"token": f"room-{i}"})
    first = app.broker.consume(QUEUE, prefetch=2, timeout=100)
    got = [_next_message(first), _next_message(first)]
    second = app.broker.consume(QUEUE, prefetch=2, timeout=100)
    assert next(second) is None, "the process already holds its prefetch"
    for m in got:
        first.ack(m)
    app.broker.acks.flush()
    assert _next_message(second) is not None


def test_a_retry_whose_error_text_has_a_lone_surrogate_and_a_nul_is_written(make_app):
    app = make_app()
    ref = app.jobs.enqueue(JOB, {"token": "bad-text"})
    consumer = app.broker.consume(QUEUE, prefetch=1, timeout=100)
    message = _next_message(consumer)
    assert app.broker.start_job(message) == 1
    error = "RuntimeError: bad\ud800text with a \x00 in it"
    app.broker.enqueue(message.copy(options={"last_error": error}), delay=60_000)  # what Retries does
    consumer.ack(message)
    record = app.broker.get_job(ref.id)
    assert record.state == "delayed"
    assert record.error == "RuntimeError: bad\\ud800text with a \x00 in it"
    assert app.broker.start_job(message) == 0, "the retried delivery is over"
    # The retry's message carries the error text in its options: the delay queue reads its id all the same.
    held = _next_message(app.broker.consume(f"{QUEUE}.DQ", prefetch=1, timeout=100))
    due = held.copy(queue_name=QUEUE)
    del due.options["eta"]
    app.broker.enqueue(due)
    again = _next_message(consumer)
    assert app.broker.start_job(again) == 2
    consumer.ack(again)
    app.broker.acks.flush()
    assert app.broker.get_job(ref.id).state == "completed"


def test_after_a_gap_in_recovery_nobody_is_declared_dead_until_they_had_a_timeout_to_heartbeat(make_app):
    a, b = make_app(), make_app()
    b.broker.maintain()  # recovery has been running
    ref = a.jobs.enqueue(JOB, {"token": "gap"})
    held = _next_message(a.broker.consume(QUEUE, prefetch=1, timeout=100))
    # Redis paused (or down) longer than the heartbeat timeout: every heartbeat is stale, nobody ran a pass.
    time.sleep(a.settings.heartbeat_timeout + 0.5)
    # The passes queued behind the pause land first, one after the other.
    assert b.broker.maintain() == {} and b.broker.maintain() == {}, "a live worker was declared dead"
    assert a.broker.start_job(held) == 1, "the live worker's delivery was taken from it"
    assert a.broker.get_job(ref.id).attempts == 1


def test_a_delay_is_counted_on_the_servers_clock_not_the_producers(make_app, monkeypatch):
    import conveyor.brokers.redis.broker as redis_broker

    app = make_app()
    real = redis_broker.current_millis
    monkeypatch.setattr(redis_broker, "current_millis", lambda: real() + 3_600_000)  # the producer is an hour ahead
    app.jobs.enqueue(JOB, {"token": "skewed-delay"}, delay=1)
    monkeypatch.setattr(redis_broker, "current_millis", real)
    held = _next_message(app.broker.consume(f"{QUEUE}.DQ", prefetch=1, timeout=100))
    assert held.options["eta"] - real() <= 1500, "the worker would hold the job for the producer's hour"


def test_an_old_deliverys_refused_ack_does_not_unhold_the_same_workers_new_delivery(make_app):
    a, b = make_app(), make_app()
    ref = a.jobs.enqueue(JOB, {"token": "same-rid"})
    consumer = a.broker.consume(QUEUE, prefetch=1, timeout=100)
    old = _next_message(consumer)
    time.sleep(a.settings.heartbeat_timeout + 0.5)
    assert b.broker.maintain() == {QUEUE: [ref.id]}
    a.broker.acks.flush()
    new = _next_message(a.broker.consume(QUEUE, prefetch=2, timeout=100))  # the same rid, back to the same worker
    assert new.options["redis_message_id"] == old.options["redis_message_id"]
    consumer.ack(old)  # the old run ends: refused
    a.broker.acks.flush()
    assert a.broker.release_orphans() == {}, "the new delivery was handed back while its worker holds it"
    assert a.broker.start_job(new) == 1


def test_a_start_or_final_failure_claim_repeated_after_a_lost_reply_counts_once(make_app):
    app = make_app()
    ref = app.jobs.enqueue(JOB, {"token": "repeated"})
    message = _next_message(app.broker.consume(QUEUE, prefetch=1, timeout=100))
    rid, delivery = message.options["redis_message_id"], message.options["redis_delivery"]
    # What redis-py's retry does after a timeout whose call had run: the same call again.
    assert app.broker.jobs.call("start", QUEUE, rid, ref.id, delivery, 1000, 0)[0] == 1
    assert app.broker.jobs.call("start", QUEUE, rid, ref.id, delivery, 1000, 0)[0] == 1
    assert app.broker.get_job(ref.id).attempts == 1
    assert app.broker.claim_final_failure(message) is True
    assert app.broker.claim_final_failure(message) is True, "the repeated claim of the same delivery was lost"


def test_a_supervised_worker_cut_off_from_redis_exits_instead_of_running_beside_the_next_delivery(
    make_app, workers, client, database_url
):
    app = make_app()
    ref = app.jobs.enqueue(JOB, {"token": "cut-off-process", "sleep": 4})
    worker = workers(QUEUE)
    wait_for(lambda: probe_runs(database_url, "cut-off-process"), timeout=60, message="the job to start")
    client.execute_command(
        "CLIENT", "PAUSE", 3000, "ALL"
    )  # longer than the self-fence threshold (0.6 of the 2 s heartbeat timeout)
    wait_for(
        lambda: app.broker.get_job(ref.id).state == "completed",
        timeout=90,
        message="the job to complete after the worker process restarted",
    )
    runs = probe_runs(database_url, "cut-off-process")
    assert runs[0]["finished_at"] is None, "the cut-off run went on to its end"
    assert any(e.get("exitcode") == 75 for e in worker.events("worker_died"))
    worker.terminate()


# -- enqueue outcomes: exact, whatever Redis or the network does --------------------


@pytest.fixture
def proxy(redis_at):
    """A TCP proxy in front of the test's Redis that can drop Redis's replies (the requests still arrive)."""
    with ReplyDroppingProxy(redis_at.port) as p:
        yield p


def _waiting(client: redis.Redis, ns: str = "conveyor") -> int:
    """Jobs waiting in QUEUE, read straight from Redis (not through the proxy); as many messages wait."""
    jobs, messages = client.zcard(f"{ns}:idx:{QUEUE}:waiting"), client.llen(f"{ns}:{QUEUE}")
    assert messages == jobs, f"{messages} messages wait for {jobs} jobs: a job was pushed twice"
    return jobs


def test_an_enqueue_whose_reply_is_lost_is_reported_as_unknown_not_as_nothing_enqueued(make_app, proxy, client):
    app = make_app(redis_url=proxy.url(), redis_socket_timeout=0.5, redis_connect_timeout=0.5, redis_retries=1)
    app.jobs.enqueue(JOB, {"token": "warm-up"})  # the pooled connection is open before the replies go
    proxy.drop_replies = True
    with pytest.raises(EnqueueOutcomeUnknown, match="may have been enqueued"):
        app.jobs.enqueue(JOB, {"token": "reply-lost"})
    proxy.drop_replies = False
    assert proxy.dropped, "the proxy dropped no reply: the test did not lose one"
    assert _waiting(client) == 2, "Redis applied the enqueue whose reply was lost"
    # Repeated with a key, an enqueue whose outcome was unknown cannot double.
    app.jobs.enqueue(JOB, {"token": "warm-up-again"})  # a connection opened while replies flow
    proxy.drop_replies = True
    with pytest.raises(EnqueueOutcomeUnknown):
        app.jobs.enqueue(JOB, {"token": "keyed"}, key="lost-reply:1")
    proxy.drop_replies = False
    again = app.jobs.enqueue(JOB, {"token": "keyed"}, key="lost-reply:1")
    assert again.deduplicated and _waiting(client) == 4


def test_an_enqueue_whose_first_reply_is_lost_is_repeated_and_counted_once(make_app, proxy, client):
    app = make_app(redis_url=proxy.url(), redis_socket_timeout=0.5, redis_connect_timeout=0.5, redis_retries=2)
    app.jobs.enqueue(JOB, {"token": "warm-up"})
    proxy.drop_next(1)
    refs = app.jobs.enqueue_many([{"job": JOB, "payload": {"token": f"repeated-{n}"}} for n in range(5)])
    assert proxy.dropped == 1
    assert not any(r.deduplicated for r in refs)
    assert _waiting(client) == 6, "the repeat of an applied batch enqueued it again"


def test_a_keyed_batch_whose_reply_is_lost_after_a_dedup_is_repeated_as_the_same_one_job(make_app, proxy, client):
    """Issue 18, finding 3 again (campaign seed 3 on Redis): a batch holding a key twice is applied (one job, the
    second a duplicate of it) and its reply lost; the repeat lands after the socket timeout, when the key's TTL is
    over. The repeat must answer what the first call did (one job, the second deduplicated), not a second job."""
    app = make_app(
        redis_url=proxy.url(), redis_socket_timeout=1.0, redis_connect_timeout=0.5, redis_retries=1, dedup_ttl=0.3
    )
    app.jobs.enqueue(JOB, {"token": "warm-up"})  # the pooled connection is open before the reply goes
    proxy.drop_next(1)
    request = {"job": JOB, "payload": {"token": "keyed-twice"}, "key": "lost-after-dedup"}
    first, second = app.jobs.enqueue_many([request, request])
    assert proxy.dropped == 1, "no reply was lost: the test proved nothing"
    assert (first.deduplicated, second.deduplicated) == (False, True)
    assert second.id == first.id, "one keyed request became two jobs"
    assert _waiting(client) == 2


def test_a_keyed_enqueue_deduplicated_then_repeated_after_its_key_expired_gets_the_same_job(make_app, proxy, client):
    """The same, one call at a time: the duplicate's call finds the key held (writes nothing), its reply is lost,
    and its repeat comes after the key expired: it must still answer the holder, not enqueue a second job."""
    app = make_app(
        redis_url=proxy.url(), redis_socket_timeout=2.0, redis_connect_timeout=0.5, redis_retries=1, dedup_ttl=1.5
    )
    held = app.jobs.enqueue(JOB, {"token": "keyed-once"}, key="lost-after-dedup:2")
    proxy.drop_next(1)
    again = app.jobs.enqueue(JOB, {"token": "keyed-once"}, key="lost-after-dedup:2")
    assert proxy.dropped == 1, "no reply was lost: the test proved nothing"
    assert again.deduplicated and again.id == held.id, "the repeat of a deduplicated enqueue made a second job"
    assert _waiting(client) == 1
    answers = list(client.scan_iter(app.broker.keys.deduplicated("*")))
    assert len(answers) == 1 and 0 < client.pttl(answers[0]) <= app.broker.jobs.answer_ttl_ms, (
        "the answer is kept, not for ever"
    )


def test_an_enqueue_repeated_after_its_job_ran_and_was_retried_does_not_run_it_again(make_app, client):
    """The repeat of an applied enqueue may land seconds later (after a socket timeout): by then the job may
    have run, failed and been retried as a new message. The repeat must still find it, not push it again."""
    app = make_app()
    ns = app.settings.redis_namespace
    ref = app.jobs.enqueue(JOB, {"token": "repeat-after-retry"})
    rid, data = (v.decode() for v in client.hmget(f"{ns}:job:{ref.id}", "rid", "payload"))
    consumer = app.broker.consume(QUEUE, prefetch=1, timeout=100)
    delivered = _next_message(consumer)
    assert app.broker.start_job(delivered) == 1
    app.broker.enqueue(delivered.copy(options={"last_error": "failed once"}))  # the retry, written by the ack
    consumer.ack(delivered)
    retried = client.hget(f"{ns}:job:{ref.id}", "rid").decode()
    assert retried != rid
    # The first enqueue's script call again, exactly as it was sent (its reply was lost).
    reply = app.broker.jobs.call("enqueue", "", 60_000, 1, QUEUE, rid, ref.id, data, JOB, "", "", "")
    assert [x.decode() if isinstance(x, bytes) else x for x in reply] == [ref.id, 0]
    assert client.lrange(f"{ns}:{QUEUE}", 0, -1) == [retried.encode()], "the repeat pushed the job again"
    assert client.hget(f"{ns}:job:{ref.id}", "rid").decode() == retried, "the repeat superseded the retry"


def test_a_refused_connection_reports_nothing_enqueued(make_app, proxy, client):
    app = make_app(redis_url=proxy.url(), redis_socket_timeout=0.5, redis_connect_timeout=0.5, redis_retries=1)
    proxy.close()  # nothing listens on the proxy's port: no request can reach Redis
    with pytest.raises(BrokerUnavailable, match="nothing was enqueued"):
        app.jobs.enqueue(JOB, {"token": "refused"})
    assert _waiting(client) == 0


def test_a_batch_enqueue_at_maxmemory_is_all_or_nothing(make_app, client):
    app = make_app()
    app.jobs.enqueue(JOB, {"token": "warm-up"})
    batch = [{"job": JOB, "payload": {"token": f"oom-{n}-" + "x" * 3000}} for n in range(100)]
    # Room for the batch as it arrives (its ~300 KB of arguments count while it runs) and for part of
    # what it stores (each job is its message plus its record, ~6 KB), not for all of it.
    client.config_set("maxmemory", client.info("memory")["used_memory"] + 1000 * 1024)
    try:
        outcomes = []
        for _ in range(3):
            before = _waiting(client)
            try:
                refs = app.jobs.enqueue_many(batch)
            except BrokerUnavailable as exc:
                assert "nothing was enqueued" in str(exc)
                outcomes.append(0)
                assert _waiting(client) == before, "a batch reported as not enqueued left jobs waiting"
            else:
                outcomes.append(len(refs))
                assert _waiting(client) == before + 100
            batch = [{**r, "payload": {"token": r["payload"]["token"] + "-again"}} for r in batch]
        assert 0 in outcomes, "the memory limit was never reached: the test proved nothing"
    finally:
        client.config_set("maxmemory", 0)


# -- a message the worker cannot decode -----------------------------------------------


def test_a_truncated_message_fails_its_job_with_a_clear_error_and_its_hook_runs(make_app, client, database_url):
    app = make_app()
    ns = app.settings.redis_namespace
    bad = app.jobs.enqueue(JOB, {"token": "truncated"})
    rid = client.hget(f"{ns}:job:{bad.id}", "rid")
    data = client.hget(f"{ns}:{QUEUE}.msgs", rid)
    end_of_id = data.index(b'"message_id":"') + len(b'"message_id":"') + len(bad.id) + 1
    client.hset(f"{ns}:{QUEUE}.msgs", rid, data[: end_of_id + 12])  # the id is readable, the body is cut
    with running(app, QUEUE):
        good = app.jobs.enqueue(JOB, {"token": "after-truncated"})
        wait_for(lambda: app.broker.get_job(good.id).state == "completed", message="the good job")
        record = wait_for(
            lambda: (r := app.broker.get_job(bad.id)) and r.state == "failed" and r, message="the truncated job to fail"
        )
        wait_for(lambda: probe_dead(database_url), message="the final-failure hook")
    assert record.error.startswith("MalformedMessage: the stored message cannot be decoded")
    assert [(d["job_id"], d["token"]) for d in probe_dead(database_url)] == [(bad.id, None)]
    counts = app.broker.queue_counts(QUEUE)
    assert (counts.active, counts.failed, counts.completed_total, counts.failed_total) == (0, 1, 1, 1)
    assert client.zscore(f"{ns}:{QUEUE}.XQ", rid) is not None, "the message is kept in the dead letters"
    assert not _acks_members(client, ns)
    assert len(probe_runs(database_url, "truncated")) == 0


def test_a_round_whose_enqueue_reply_is_lost_stays_queued_and_its_retry_runs_it_once(make_app, proxy, client):
    """The platform must not fail a round whose job may exist: it stays queued, and the client's retry (the
    same message id) finds the run and enqueues its job keyed, so the job that did land is not doubled."""
    from conveyor.platform import records
    from conveyor.platform.rounds import start_round
    from tests.support.platform_support import make_task

    app = make_app(redis_url=proxy.url(), redis_socket_timeout=0.5, redis_connect_timeout=0.5, redis_retries=1)
    make_task(app, "t-lost")
    app.jobs.enqueue(JOB, {"token": "warm-up"})  # a pooled connection opened while replies flow
    proxy.drop_replies = True
    with pytest.raises(EnqueueOutcomeUnknown):
        start_round(app, task_id="t-lost", content="hello", message_id="m-lost")
    proxy.drop_replies = False
    again = start_round(app, task_id="t-lost", content="hello", message_id="m-lost")
    assert not again.created and again.job_id
    with app.pool.connection() as conn:
        assert records.get_run(conn, again.run_id).status == "queued"
    runs = [k for k in client.keys("conveyor:job:*") if client.hget(k, "job") in (b"chat.run", "chat.run")]
    assert len(runs) == 1, "the retried round enqueued a second run job"


def test_a_cancel_whose_first_reply_is_lost_is_repeated_and_answers_what_it_did(make_app, proxy, client):
    """Soak seed 241633 (Redis, replies to the producer dropped): a waiting job's cancel ended it cancelled and
    its reply was lost; redis-py repeated the call, which found the job ended and answered ``finished`` (it had
    ended before its cancel, yet it ended cancelled). The repeat answers what the first call did."""
    app = make_app(redis_url=proxy.url(), redis_socket_timeout=0.5, redis_connect_timeout=0.5, redis_retries=2)
    ref = app.jobs.enqueue(JOB, {"token": "cancel-repeated"}, delay=60)
    proxy.drop_next(1, containing=b"cancelled")  # the script's reply, not the lookup of the job's queue before it
    assert app.jobs.cancel(ref.id) == "cancelled"
    assert proxy.dropped == 1, "no reply was lost: the test proved nothing"
    assert app.broker.get_job(ref.id).state == "cancelled"
    assert app.jobs.cancel(ref.id) == "finished", "a second cancel (a call of its own) is a no-op"


def test_a_cancel_outcome_repeated_after_a_lost_reply_still_ends_the_job_for_its_holder(make_app):
    """The holder runs the cancel hook only when its ``cancelled`` outcome ended the job: the same call repeated
    by redis-py after a lost reply must answer so again, not refused (the hook would be lost)."""
    app = make_app()
    ref = app.jobs.enqueue(JOB, {"token": "cancelled-repeated"})
    message = _next_message(app.broker.consume(QUEUE, prefetch=1, timeout=100))
    assert app.broker.start_job(message) == 1
    assert app.jobs.cancel(ref.id) == "requested"
    rid, delivery = message.options["redis_message_id"], message.options["redis_delivery"]
    first = app.broker.jobs.call("cancelled", QUEUE, rid, ref.id, delivery, 1000, "JobCancelled: stopped")
    assert first == 1
    assert app.broker.jobs.call("cancelled", QUEUE, rid, ref.id, delivery, 1000, "JobCancelled: stopped") == 1
    assert app.broker.get_job(ref.id).state == "cancelled"
    assert app.broker.queue_counts(QUEUE).cancelled == 1, "counted once"

"""The Redis broker on a private three-primary Redis Cluster (``redis+cluster://``).

The contract suite runs the whole broker contract on it (broker
``redis-cluster``); these tests check what is the cluster's own: every key a
run wrote sits on the slot of its queue's name, queues spread over the
primaries, a job is found by its id alone, a batch spanning queues is
enqueued, and a dedup key is held within its queue.
"""

from __future__ import annotations

import re
from typing import Any

import dramatiq
import pytest
import redis

from conveyor.brokers.base import EnqueueItem
from conveyor.brokers.redis import RedisBroker
from conveyor.settings import Settings
from tests.contract.drive import LONG_TTL, Pump, enqueue, message, record_in

QUEUES = [f"shard{i}" for i in range(8)]


def _broker(url: str, queues: list[str]) -> RedisBroker:
    settings = Settings(broker="redis", redis_url=url, heartbeat_timeout=1.0, maintenance_interval=0.1)
    broker = RedisBroker(
        url=url, middleware=[], namespace="ns", heartbeat_timeout=1.0, retention=3600, settings=settings
    )
    for queue in queues:
        dramatiq.actor(lambda payload: None, broker=broker, actor_name=f"job.{queue}", queue_name=queue)
    return broker


@pytest.fixture
def made(clean_env, redis_cluster_url):
    brokers: list[RedisBroker] = []

    def make(queues: list[str] = QUEUES) -> RedisBroker:
        brokers.append(_broker(redis_cluster_url, queues))
        return brokers[-1]

    yield make
    for broker in brokers:
        broker.close()


def _keys_by_node(cluster) -> dict[int, list[bytes]]:
    out = {}
    for node in cluster.nodes:
        with redis.Redis(host="127.0.0.1", port=node.port) as client:
            out[node.port] = list(client.scan_iter(count=1000))
    return out


def _run_each_queue(broker: RedisBroker) -> None:
    """A keyed job, a delayed one and a failed one in every queue, each fetched, started and settled."""
    for queue in QUEUES:
        done = enqueue(broker, {"n": 1}, key=f"k:{queue}", queue_name=queue, job=f"job.{queue}")
        enqueue(broker, {"n": 2}, delay_ms=60_000, queue_name=queue, job=f"job.{queue}")
        failing = enqueue(broker, {"n": 3}, queue_name=queue, job=f"job.{queue}")
        pump = Pump(broker, queue)
        try:
            for _ in range(2):
                delivered = pump.receive()
                assert broker.start_job(delivered) == 1
                if delivered.message_id == done.id:
                    pump.ack(delivered)
                else:
                    assert broker.claim_final_failure(delivered)
                    pump.nack(delivered)
            record_in(broker, done.id, "completed")
            record_in(broker, failing.id, "failed")
        finally:
            pump.close()
    broker.maintain()


def test_every_key_of_a_run_is_on_the_slot_of_its_queue_and_queues_spread_over_the_primaries(made, redis_cluster):
    broker = made()
    _run_each_queue(broker)
    held = _keys_by_node(redis_cluster)
    with redis.Redis(host="127.0.0.1", port=redis_cluster.nodes[0].port) as client:
        queue_of_node: dict[int, set[str]] = {}
        for port, keys in held.items():
            for key in keys:
                name = key.decode()
                if name == "ns:__queues__":  # the one key no queue owns, read by single-key commands only
                    continue
                tag = re.fullmatch(r"ns\{([^}]+)\}:.*", name)
                assert tag, f"a key without its queue's hash tag: {name}"
                queue = tag.group(1)
                assert client.execute_command("CLUSTER", "KEYSLOT", name) == client.execute_command(
                    "CLUSTER", "KEYSLOT", queue
                )
                queue_of_node.setdefault(port, set()).add(queue)
    assert set().union(*queue_of_node.values()) == set(QUEUES)
    assert len(queue_of_node) >= 2, f"every queue on one primary: {queue_of_node}"


def test_a_job_is_found_by_its_id_from_a_process_that_does_not_declare_its_queue(made):
    producer = made()
    ref = enqueue(producer, {"n": 1}, queue_name="shard5", job="job.shard5")
    reader = made(["shard0"])
    record = reader.get_job(ref.id)
    assert record is not None and record.queue == "shard5" and record.state == "waiting"
    assert reader.delete_job(ref.id)
    assert reader.get_job(ref.id) is None


def test_a_batch_spanning_queues_is_enqueued_and_keys_are_held_within_their_queue(made):
    broker = made()
    refs = broker.enqueue_jobs(
        [
            EnqueueItem(message({"n": 1}, queue_name="shard1", job="job.shard1"), key="k:shared"),
            EnqueueItem(message({"n": 2}, queue_name="shard2", job="job.shard2"), key="k:shared"),
            EnqueueItem(message({"n": 3}, queue_name="shard1", job="job.shard1"), key="k:shared"),
        ],
        dedup_ttl=LONG_TTL,
    )
    assert not refs[0].deduplicated and not refs[1].deduplicated and refs[0].id != refs[1].id
    assert (refs[2].id, refs[2].deduplicated) == (refs[0].id, True)
    assert [broker.queue_counts(q).waiting for q in ("shard1", "shard2")] == [1, 1]


def test_pause_and_counts_are_per_queue(made):
    broker: Any = made()
    enqueue(broker, {"n": 1}, queue_name="shard3", job="job.shard3")
    broker.pause_queue("shard3")
    assert broker.queue_counts("shard3").paused and not broker.queue_counts("shard4").paused
    consumer = broker.consume("shard3", prefetch=1, timeout=100)
    assert next(consumer) is None, "a paused queue hands out nothing"
    consumer.close()
    broker.resume_queue("shard3")
    assert not broker.queue_counts("shard3").paused


@pytest.fixture
def app(clean_env, redis_cluster_url, database_url):
    from conveyor.app import App
    from tests.support.harness import make_settings

    app = App(make_settings("redis", redis_cluster_url, database_url))
    yield app
    app.close()


def test_the_stores_beside_the_broker_keep_each_script_call_on_one_slot(app):
    """The fleet registry, the rollups and the budgets (several budgets' keys in one take) on the cluster."""
    from conveyor.brokers.fleet import fleet_store
    from conveyor.brokers.fleet.base import WorkerInfo
    from conveyor.brokers.rollup import rollup_store
    from conveyor.budgets import build_store
    from conveyor.budgets.base import Take

    fleet = fleet_store(app)
    info = WorkerInfo(
        id="w-1", host="h", pid=1, queues=["critical"], threads=2, version="t", started_at=None, heartbeat_at=None
    )
    fleet.beat(info, keep=60)
    assert [w.id for w in fleet.workers()[1]] == ["w-1"]
    ref = enqueue(app.broker, {"n": 1}, key="k:fleet", queue_name="critical", job="test.probe.critical")
    assert fleet.find_by_key("k:fleet") == [ref.id]
    # Enqueue totals are counted by each queue's enqueue script on its own slot, and read from all of them.
    enqueue(app.broker, {"n": 1}, key="k:fleet", queue_name="critical", job="test.probe.critical")  # a duplicate
    app.jobs.enqueue_many([{"job": "test.probe.llm", "payload": {"token": f"t{i}"}} for i in range(3)])
    assert fleet.enqueued_totals() == {("critical", "test.probe.critical"): 1, ("llm", "test.probe.llm"): 3}

    rollups = rollup_store(app)
    rollups.sample_depth({"critical": 3, "default": 1})
    rollups.read(None, 3600)

    budgets = build_store(app)
    try:
        waits = budgets.take([Take("user:1", 10, 60, 1), Take("team:9", 100, 60, 1)])
        assert waits == [0.0, 0.0]
    finally:
        budgets.close()


def test_enqueue_totals_an_older_producer_counted_are_still_read_after_the_upgrade(app):
    """Review of db69dd2 (rolling deploy): before it, every producer counted its enqueues in the one
    shared hash (``{ns}:fleet:enqueued``, the fleet store's own pipeline); on a cluster the totals are now
    read from each queue's slot only, so what older producers counted (the whole history, and every job
    they enqueue during the rollout) drops out of conveyor_jobs_enqueued: a never-reset counter goes down."""
    from conveyor.brokers.fleet import fleet_store

    broker = app.broker
    # What a producer of the previous release wrote for 5 jobs (its RedisFleetStore.count_enqueued).
    broker.client.hincrby(f"{broker.keys.shared}:fleet:enqueued", "critical\x1ftest.probe.critical", 5)
    app.jobs.enqueue("test.probe.critical", {"token": "after-upgrade"})
    assert fleet_store(app).enqueued_totals() == {("critical", "test.probe.critical"): 6}


def test_a_stream_follower_blocks_on_the_node_of_its_stream_and_wakes_on_a_chunk(app):
    """XREAD BLOCK through the asyncio cluster client (redis_client.async_reader)."""
    import asyncio
    import threading

    from conveyor.platform.streams import build_buffer

    buffer = build_buffer(app)

    async def follow() -> list[int]:
        async with buffer.follow("run-1") as follower:
            threading.Timer(0.3, lambda: buffer.append("run-1", 1, "hello")).start()
            return [e.seq for e in await follower.entries(0, timeout=5)]

    assert asyncio.run(follow()) == [1]


def test_a_script_call_sent_to_a_node_not_owning_its_slot_ran_nothing_and_is_not_sent(made):
    """MOVED is NotSent: the enqueue's next attempt (after a topology refresh) may go, nothing doubles."""
    from conveyor.brokers.redis.cluster import NodeClient
    from conveyor.brokers.redis.sending import NotSent, call_once

    broker: Any = made()
    scope = broker.keys.scope("shard1").ns
    owner = broker.client.get_node_from_key(scope)
    other = next(n for n in broker.client.get_primaries() if n.name != owner.name)
    wrong = NodeClient(broker.client.get_redis_connection(other), broker.client)
    args = ["enqueue", "", broker.broker_id, 1000, 1, "shard1", "rid-1", "id-1", "{}", "job.shard1", "", "", ""]
    with pytest.raises(NotSent) as caught:
        call_once(wrong, broker.jobs.script, [scope], args)
    assert "MOVED" in str(caught.value.cause) or type(caught.value.cause).__name__ == "MovedError"
    assert broker.get_job("id-1") is None

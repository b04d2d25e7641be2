"""The exactly-once credit run on a private three-primary Redis Cluster (``redis+cluster://``).

Worker processes on ``REDIS_URL=redis+cluster://…`` (tests/support/cluster.py)
charge through the ledger; one of them is SIGKILLed mid-run. Its jobs come back
after the heartbeat timeout, every charge is applied exactly once, and the
queue's keys, the fleet's and the rollups' all stay on their own slots (a
script touching two slots would have failed the run). On a cluster with a
replica per primary, the primary serving the queue is SIGKILLed mid-run: its
replica takes over, the workers follow it, and every charge is still applied
once (what the dead primary acknowledged but had not replicated can run
again — at least once, as after a crash — never charge twice).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.acceptance.test_pg_processes import all_done, assert_ledger_exact, charges, rows
from tests.support.harness import make_settings
from tests.support.waiting import wait_for


@pytest.fixture
def settings(clean_env, database_url, redis_cluster_url):
    return make_settings("redis", redis_cluster_url, database_url)


def test_charges_on_a_redis_cluster_survive_a_sigkilled_worker_exactly_once(app, workers, settings, database_url):
    group = workers("critical", processes=2)
    wait_for(lambda: len(group.child_pids()) == 2, timeout=60, message="two worker processes")
    requests = charges(120, "cluster", sleep=0.05)
    app.jobs.enqueue_many(requests)
    wait_for(
        lambda: rows(database_url, "SELECT count(*) FROM credit_entries")[0][0] >= 15,
        timeout=60,
        interval=0.05,
        message="charges running before the kill",
    )
    os.kill(group.child_pids()[0], signal.SIGKILL)
    wait_for(
        lambda: all_done(app, "critical", len(requests)), timeout=120, interval=0.2, message="every charge to be done"
    )
    assert_ledger_exact(settings, database_url, requests)
    # The kill is the one error: no script call, fleet beat or rollup flush was refused by the cluster.
    errors = [e for e in group.events() if e.get("level") == "error" and e.get("event") != "worker_died"]
    assert not errors, errors[:3]


@pytest.fixture(scope="module")
def replicated():
    """Three primaries, each with one replica."""
    from tests.support.cluster import RedisCluster

    with RedisCluster(replicas=1) as cluster:
        yield cluster


def test_wait_replicas_on_a_cluster_with_a_replica_each_enqueues_and_claims(clean_env, database_url, replicated):
    """With a replica per primary, each enqueue and claim is acknowledged by its queue's replica (before the
    failover test below, which leaves one primary without a replica)."""
    from conveyor.app import App

    replicated.flush()
    settings = make_settings("redis", replicated.url, database_url, redis_wait_replicas=1, redis_wait_timeout=5)
    app = App(settings)
    try:
        for queue, job in (("critical", "test.probe.critical"), ("indexing", "test.probe.indexing")):
            ref = app.jobs.enqueue(job, {"token": queue}, key=f"wait:{queue}")
            consumer = app.broker.consume(queue, prefetch=1, timeout=1000)
            try:
                got = wait_for(lambda c=consumer: next(c), timeout=30, message=f"the claim on {queue}")
                assert got.message_id == ref.id
                counts = app.broker.queue_counts(queue)
                assert (counts.waiting, counts.active) == (0, 1), counts
            finally:
                consumer.close()
    finally:
        app.close()
        replicated.flush()  # the failover test below counts the queue's jobs


def test_charges_go_on_when_the_primary_of_their_queue_dies_and_its_replica_takes_over(
    clean_env, database_url, replicated, tmp_path
):
    import redis

    from conveyor.app import App
    from conveyor.errors import ConveyorError
    from tests.support.harness import WorkerProcess

    settings = make_settings("redis", replicated.url, database_url, redis_socket_timeout=3)
    app = App(settings)
    group = WorkerProcess(settings, "critical", 2, log=tmp_path / "worker.log")
    try:
        wait_for(lambda: len(group.child_pids()) == 2, timeout=60, message="two worker processes")
        # Slow enough that the first 60 outlast the WAIT below: a replica acks once a second, and on a
        # loaded machine WAIT was seen to take 2.4 s, long enough for 60 jobs of 0.3 s to all finish.
        requests = charges(120, "failover", sleep=1.2)
        first, second = requests[:60], requests[60:]
        app.jobs.enqueue_many(first)
        victim = replicated.owner("conveyor{critical}")
        with redis.Redis(host="127.0.0.1", port=victim.port, socket_timeout=5) as primary:
            primary.execute_command("WAIT", 1, 5000)  # the enqueues are on the replica: replication is asynchronous
        wait_for(
            lambda: rows(database_url, "SELECT count(*) FROM credit_entries")[0][0] >= 15,
            timeout=60,
            interval=0.05,
            message="charges running before the failover",
        )
        victim.kill()
        assert rows(database_url, "SELECT count(*) FROM credit_entries")[0][0] < len(first), "killed mid-run"
        wait_for(lambda: replicated.owner("conveyor{critical}") is not victim, timeout=60, message="a replica promoted")
        replicated.wait_ready()
        for _ in range(50):  # keyed: an enqueue repeated after an error returns the first job
            try:
                app.jobs.enqueue_many(second)
                break
            except ConveyorError:
                time.sleep(0.2)
        else:
            raise AssertionError("no enqueue went through after the failover")

        def done() -> bool:
            try:
                return all_done(app, "critical", len(requests))
            except ConveyorError:
                return False

        wait_for(done, timeout=120, interval=0.5, message="every charge to be done on the new primary")
        assert_ledger_exact(settings, database_url, requests)
    finally:
        group.send_stop()
        group.terminate()
        app.close()


def test_wait_replicas_counts_the_replicas_of_the_queues_own_primary(clean_env, database_url, replicated):
    """The queue's primary has lost its replica while the other primaries keep theirs: a WAIT sent through
    the cluster client goes to every primary and sums their answers, so it would pass; conveyor WAITs on
    the queue's node and refuses the enqueue's success and the claim. Runs last: it kills a replica."""
    import redis

    from conveyor.app import App
    from tests.integration.test_redis_wait_replicas import assert_unreplicated

    replicated.flush()
    owner = replicated.owner("conveyor{llm}")

    def replication(node) -> dict:
        with redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=5) as c:
            return c.info("replication")

    for node in replicated.nodes:
        if node.is_running and node is not owner:
            info = replication(node)
            if info["role"] == "slave" and int(info["master_port"]) == owner.port:
                node.kill()
    wait_for(lambda: replication(owner)["connected_slaves"] == 0, timeout=30, message="the primary to see no replica")
    others = [n for n in replicated.nodes if n.is_running and n is not owner and replication(n)["role"] == "master"]
    assert any(replication(n)["connected_slaves"] for n in others), "another primary keeps a replica"

    settings = make_settings("redis", replicated.url, database_url, redis_wait_replicas=1, redis_wait_timeout=0.2)
    app = App(settings)
    try:
        assert_unreplicated(app, "llm")
    finally:
        app.close()

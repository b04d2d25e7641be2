"""A worker host cut off from Redis and Postgres while it runs jobs, and reconnected later.

The host is a network namespace joined by a veth pair (see netns.py); the
servers listen on the veth address as well as on loopback. While it is cut
off, its jobs go to the worker that still sees the servers after the lease;
when it comes back, whatever it still thinks it holds must not land on the
jobs' later deliveries.
"""

from __future__ import annotations

import tempfile
import time

import pytest

from tests.faults.checker import Checker
from tests.faults.harness import LEASE, RECOVERY, open_runs
from tests.faults.netns import NetworkNamespace
from tests.faults.workload import Producer, long_jobs, mixed
from tests.support.brokers import SERVER_BROKERS
from tests.support.servers import PostgresServer, RedisServer
from tests.support.waiting import wait_for

FAULT = "worker host cut off (netns), reconnected"

#: Seconds the host stays cut off: past the lease and a recovery pass, so its jobs are taken over.
CUT_SECONDS = LEASE + RECOVERY + 3.0


@pytest.fixture(scope="module")
def namespace():
    ns = NetworkNamespace()
    try:
        yield ns
    finally:
        ns.close()


@pytest.fixture(scope="module")
def ns_servers(namespace):
    """Durable servers that listen on loopback and on the veth address."""
    pg = PostgresServer(
        tempfile.mkdtemp(prefix="conveyor-fault-pg-ns-"),
        settings={**PostgresServer.DURABLE, "listen_addresses": f"127.0.0.1,{namespace.host_address}"},
    )
    try:
        pg.trust(f"{namespace.ns_address}/32")
        redis = RedisServer(
            tempfile.mkdtemp(prefix="conveyor-fault-redis-ns-"),
            durable=True,
            bind=("127.0.0.1", namespace.host_address),
        )
        try:
            yield pg, redis
        finally:
            redis.close()
    finally:
        pg.close()


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_worker_host_cut_off_and_reconnected(world, broker, namespace, ns_servers):
    pg, redis = ns_servers
    cluster = world(broker, FAULT, pg=pg, redis=redis)
    address = namespace.host_address
    dbname = cluster.settings.database_url.rsplit("/", 1)[1]
    remote = cluster.settings.model_copy(
        update={
            "database_url": pg.url_on(address, dbname),
            "redis_url": redis.url_on(address) if broker == "redis" else None,
        }
    )
    # The cut-off host serves the queues without charges: a charge hanging in a cut-off
    # connection lands when the host is back (the ledger keeps it once, but the run
    # log would show it overlapping its rerun, and no fence can stop a run already begun).
    far = cluster.start_workers(
        "far", queues=("indexing", "nudge"), prefix=namespace.prefix, settings=remote, wait=False
    )
    near = cluster.start_workers("near", wait=False)
    far.wait_ready()
    near.wait_ready()
    plan = mixed(60, "cut") + long_jobs(8, "cutlong", sleep=1.2, queue="indexing")
    producer = Producer(cluster.app, plan, spread=3.0)
    producer.start()
    far_pids = set(far.child_pids())
    wait_for(
        lambda: any(pid in far_pids for _, pid, _ in open_runs(cluster, "")),
        timeout=60,
        message="jobs running on the far host",
    )
    namespace.cut()
    try:
        time.sleep(CUT_SECONDS)
    finally:
        namespace.heal()
    healed_at = time.time()
    checker = Checker(cluster, plan, fault=FAULT)
    checker.check(healed_at, producer=producer)

"""A worker that cannot heartbeat exits before its lease runs out; its job then runs once, elsewhere.

The worker host is cut off (network namespace, the ``namespace`` fixture)
while it runs a job that outlasts the lease several times. Its watchdog
must end the process (exit code 75, conveyor.tasks.watchdog) before
recovery can hand the job to the worker that still sees the servers: the
job's first run is then killed mid-run and its second, on the other host,
starts only after that first one's process is gone.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest

from conveyor.tasks.watchdog import SELF_FENCE_EXIT
from tests.faults.checker import Checker
from tests.faults.harness import LEASE, open_runs
from tests.faults.workload import Producer, long_jobs
from tests.support.brokers import SERVER_BROKERS
from tests.support.waiting import wait_for

FAULT = "worker host cut off (netns) during a long job: self-fence"

#: The job sleeps this long: several leases, so only the self-fence can end its first run in time.
JOB_SECONDS = 2 * LEASE


def _ts(event: dict) -> float:
    return dt.datetime.strptime(event["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC).timestamp()


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_a_cut_off_worker_exits_before_its_lease_and_its_job_runs_once_elsewhere(
    world,
    broker,
    namespace,
    ns_servers,
):
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
    far = cluster.start_workers("far", queues=("nudge",), prefix=namespace.prefix, settings=remote)
    plan = long_jobs(1, "fence", sleep=JOB_SECONDS, queue="nudge")
    producer = Producer(cluster.app, plan, spread=0.1)
    producer.start()
    far_pids = set(far.child_pids())
    wait_for(
        lambda: any(pid in far_pids for _, pid, _ in open_runs(cluster, "fence-")),
        timeout=60,
        message="the job running on the far host",
    )
    namespace.cut()
    cut_at = time.time()
    try:
        near = cluster.start_workers("near", queues=("nudge",))  # in the cut: the job must not end first
        wait_for(
            lambda: far.events("self_fence"), timeout=3 * LEASE, interval=0.05, message="the far worker fencing itself"
        )
        # Its job comes back after the lease and a recovery pass, and runs to its end on the near host.
        near_pids = set(near.child_pids())
        wait_for(
            lambda: any(r.pid in near_pids and r.ended_at for r in Checker(cluster, plan, fault=FAULT).runs()),
            timeout=JOB_SECONDS + 6 * LEASE,
            message="the job rerun to its end on the near host",
        )
    finally:
        namespace.heal()
    healed_at = time.time()

    fence = far.events("self_fence")[0]
    died = [e for e in far.events("worker_died") if e["exitcode"] == SELF_FENCE_EXIT]
    assert died, far.events("worker_died")
    fenced_in = _ts(fence) - cut_at
    assert fence["heartbeat_age_s"] < LEASE and fenced_in < LEASE, (fenced_in, fence)
    runs = sorted(
        (r for r in Checker(cluster, plan, fault=FAULT).runs() if r.token.startswith("fence-")),
        key=lambda r: r.started_at,
    )
    assert [r.pid in far_pids for r in runs] == [True, False], runs
    first, second = runs
    assert first.ok is False, first  # killed mid-run (ended when its process fenced itself), not finished
    assert second.delivery > first.delivery and second.ok, second
    assert second.started_at > first.ended_at, (first, second)
    print(
        f"\n{broker}: cut -> self-fence exit {fenced_in:.2f}s (heartbeat age {fence['heartbeat_age_s']}s, "
        f"lease {LEASE}s); cut -> rerun start {second.started_at.timestamp() - cut_at:.2f}s"
    )
    Checker(cluster, plan, fault=FAULT).check(healed_at, producer=producer)

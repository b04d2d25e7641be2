"""The fault harness's worker groups outlive a server that is away when they start.

A group a campaign kind starts for a window (user-retries' poll group, time-limits' hammering group) may
start while another fault has Postgres restarting: ``conveyor worker`` then stops at once with
``conveyor: error: Postgres is unavailable …`` and exit 2 (seen in CI on a loaded machine, its poll jobs
left waiting, for only that group serves their queue). ``Supervisor.wait_ready`` starts it again, as a
process manager would, and the group serves its queue once the server is back.
"""

from __future__ import annotations

from tests.faults.harness import REFUSED_TO_START
from tests.faults.jobs_extra import POLL_QUEUE
from tests.support.waiting import wait_for

FAULT = "worker group started while Postgres is down"


def test_a_group_that_refused_to_start_while_postgres_was_down_is_started_again_and_serves(world, fault_pg):
    cluster = world("postgres", FAULT, imports="tests.faults.jobs,tests.faults.jobs_v2,tests.faults.jobs_extra")
    fault_pg.stop()
    try:
        group = cluster.start_workers("late", queues=(POLL_QUEUE,), wait=False)
        wait_for(lambda: group.proc.poll() is not None, timeout=60, message="the group to refuse to start")
        assert group.proc.returncode == REFUSED_TO_START
        assert "Postgres is unavailable" in group.last_line()
    finally:
        fault_pg.start()
    group.wait_ready()
    assert group.restarts >= 1
    ref = cluster.app.jobs.enqueue_many([{"job": "fault.poll", "payload": {"token": "late-0", "polls": 0}}])[0]
    wait_for(
        lambda: (r := cluster.app.broker.get_job(ref.id)) is not None and r.state == "completed",
        timeout=60,
        message="the poll job to complete",
    )

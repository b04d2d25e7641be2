"""The campaign's wait for quiet (tests/faults/campaign.py ``settle``) on a stand-in broker whose backlog
drains at a given pace: a slow backlog is waited for, a stalled one is not."""

from __future__ import annotations

import time
from types import SimpleNamespace

from conveyor.brokers.base import JobRecord, QueueCounts
from tests.faults import campaign
from tests.faults.history import ACKED, Request


class Draining:
    """A broker with ``backlog`` waiting jobs on one queue; one ends every ``pace`` seconds (None: never)."""

    def __init__(self, backlog: int, pace: float | None) -> None:
        self.backlog, self.pace, self.began = backlog, pace, time.monotonic()

    def left(self) -> int:
        if self.pace is None:
            return self.backlog
        return max(0, self.backlog - int((time.monotonic() - self.began) / self.pace))

    def get_job(self, job_id: str) -> JobRecord:
        return JobRecord(id=job_id, queue="nudge", job="fault.work.nudge", state="completed")

    def queue_counts(self, queue: str) -> QueueCounts:
        return QueueCounts(queue=queue, waiting=self.left() if queue == "nudge" else 0)


def stage(broker: Draining) -> SimpleNamespace:
    item = campaign.Item(Request("a", "fault.work.nudge", outcome=ACKED, job_ids=["A"]), {})
    return SimpleNamespace(cluster=SimpleNamespace(app=SimpleNamespace(broker=broker)), poisoned=[], added=[item])


def test_a_backlog_still_draining_at_the_deadline_is_waited_for(monkeypatch):
    # Seed 226143 on redis-cluster: a queue whose worker was killed late drained for a minute past the
    # quiet period; the history read meanwhile saw jobs complete between its reads.
    monkeypatch.setattr(campaign, "BACKLOG_STALL", 1.0)
    broker = Draining(backlog=8, pace=0.25)
    campaign.settle(stage(broker), [], deadline=time.time() + 0.2)
    assert broker.left() == 0


def test_a_backlog_that_stopped_draining_is_left_to_the_checker(monkeypatch):
    monkeypatch.setattr(campaign, "BACKLOG_STALL", 1.0)
    broker = Draining(backlog=8, pace=None)
    began = time.monotonic()
    campaign.settle(stage(broker), [], deadline=time.time() + 0.2)
    assert broker.left() == 8
    assert time.monotonic() - began < 5.0, "a stalled backlog is not waited for up to the grace"

"""Fair shares per group: a queue serves its groups round-robin and caps one group's held jobs."""

from __future__ import annotations

import time
from typing import Any

import pytest
from dramatiq import Message

from conveyor.brokers.base import PRIORITY, CancelOutcome, EnqueueItem
from tests.contract.drive import JOB, LONG_TTL, OTHER_QUEUE, QUEUE, drain, record_in, retry

#: Run on the pooler and the cluster too: the grouped claim is a two-statement transaction through the pooler; the group keys must share the queue's slot.
pytestmark = pytest.mark.topology


def grouped(n: int, group: str | None, priority: int = 0) -> EnqueueItem:
    options: dict[str, Any] = {"group": group} if group else {}
    if priority:
        options[PRIORITY] = priority
    return EnqueueItem(
        Message(queue_name=QUEUE, actor_name=JOB, args=({"n": n, "g": group},), kwargs={}, options=options)
    )


@pytest.mark.needs("groups")
def test_a_small_group_is_served_between_a_big_groups_jobs_not_after_them(broker, pump):
    broker.enqueue_jobs([grouped(n, "a") for n in range(200)], dedup_ttl=LONG_TTL)
    broker.enqueue_jobs([grouped(n, "b") for n in range(3)], dedup_ttl=LONG_TTL)
    broker.enqueue_jobs([grouped(n, None) for n in range(3)], dedup_ttl=LONG_TTL)
    served = drain(broker, pump(broker, prefetch=4), 12, "g")
    # All of b and of the default group within a few rounds, while a's backlog still waits.
    assert served.count("b") == 3 and served.count(None) == 3, served


@pytest.mark.needs("groups")
def test_within_a_group_jobs_keep_the_queue_order(broker, pump):
    broker.enqueue_jobs([grouped(n, "a") for n in range(5)] + [grouped(n, "b") for n in range(5)], dedup_ttl=LONG_TTL)
    p = pump(broker, prefetch=1)
    seen: dict[str, list[int]] = {"a": [], "b": []}
    for _ in range(10):
        delivered = p.receive()
        broker.start_job(delivered)
        p.ack(delivered)
        seen[delivered.args[0]["g"]].append(delivered.args[0]["n"])
    assert seen == {"a": [0, 1, 2, 3, 4], "b": [0, 1, 2, 3, 4]}


@pytest.mark.needs("groups")
def test_a_group_never_holds_more_than_its_cap_across_workers(peer, pump):
    first, second = peer(), peer()
    for b in (first, second):
        b.group_caps = {QUEUE: 2}
    first.enqueue_jobs([grouped(n, "a") for n in range(6)] + [grouped(n, "b") for n in range(2)], dedup_ttl=LONG_TTL)
    held = [pump(first, prefetch=4), pump(second, prefetch=4)]
    # Either worker may claim all four the caps allow (the two start at once): wait for the first from
    # whichever, then gather the rest.
    got: list[tuple[int, Any]] = []
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        got = [(i, m) for i, p in enumerate(held) if (m := p.poll(0.1)) is not None]
    assert got, "nothing was delivered to either worker within 10 s"
    got += [(i, m) for _ in range(10) for i, p in enumerate(held) if (m := p.poll(0.3)) is not None]
    # Two of a, two of b, whichever worker claimed them; a's third waits for a slot.
    assert sorted(d.args[0]["g"] for _, d in got) == ["a", "a", "b", "b"]
    # An ack frees one slot of a, once: exactly one more of a is handed out.
    i, done = next((i, d) for i, d in got if d.args[0]["g"] == "a")
    held[i].broker.start_job(done)
    held[i].ack(done)
    again = [m for _ in range(6) for p in held if (m := p.poll(0.25)) is not None]
    assert [d.args[0]["g"] for d in again] == ["a"]


@pytest.mark.needs("groups")
def test_a_nack_and_a_hand_back_free_the_slot_they_held(peer, pump):
    broker = peer()
    broker.group_caps = {QUEUE: 1}
    broker.enqueue_jobs([grouped(n, "a") for n in range(3)], dedup_ttl=LONG_TTL)
    p = pump(broker, prefetch=3)
    first = p.receive()
    p.nothing(within=0.5)
    broker.start_job(first)
    p.nack(first)
    second = p.receive()
    assert second.args[0]["n"] == 1
    p.requeue([second])
    # Handed back: its slot is free again (which of the two waiting goes next is a tie: one batch, one time).
    assert p.receive().args[0]["n"] in (1, 2)
    p.nothing(within=0.5)


@pytest.mark.needs("groups")
def test_a_worker_busy_with_ungrouped_jobs_serves_a_group_that_appears_meanwhile(broker, pump):
    broker.enqueue_jobs([grouped(n, None) for n in range(100)], dedup_ttl=LONG_TTL)
    p = pump(broker, prefetch=2)
    assert drain(broker, p, 4, "g") == [None] * 4  # full claims of the default group, one after another
    broker.enqueue_jobs([grouped(n, "late") for n in range(2)], dedup_ttl=LONG_TTL)
    # Not after the default group's backlog: within a few claims.
    assert drain(broker, p, 10, "g").count("late") == 2


def test_every_broker_takes_a_grouped_job_and_runs_it(broker, pump):
    # Inline, which serves no group apart, accepts the group too and serves the job as any other.
    (ref,) = broker.enqueue_jobs([grouped(1, "user:42")], dedup_ttl=LONG_TTL)
    assert not ref.deduplicated
    assert drain(broker, pump(broker), 1, "g") == ["user:42"]


@pytest.mark.needs("groups")
def test_a_delayed_job_and_a_retry_of_a_group_wait_for_its_groups_slot(peer, pump):
    broker = peer()
    broker.group_caps = {QUEUE: 1}
    broker.enqueue_jobs([grouped(0, "a")], dedup_ttl=LONG_TTL)
    broker.enqueue_jobs([EnqueueItem(grouped(1, "a").message, None, 300)], dedup_ttl=LONG_TTL)
    p = pump(broker, prefetch=3)
    first = p.receive()
    p.nothing(within=1.0)  # a1 is due, but a0 holds a's one slot
    broker.start_job(first)
    p.ack(first)
    second = p.receive()
    assert second.args[0]["n"] == 1
    broker.start_job(second)
    broker.enqueue_jobs([grouped(2, "a")], dedup_ttl=LONG_TTL)
    p.nothing(within=0.5)
    retry(broker, p, second, "boom", 200)  # the retry frees the slot: a2 runs
    third = p.receive()
    assert third.args[0]["n"] == 2
    broker.start_job(third)
    p.nothing(within=0.8)  # a1's retry is due, and waits for a2's slot
    p.ack(third)
    assert p.receive().args[0]["n"] == 1


@pytest.mark.needs("groups")
def test_cancelled_and_deleted_jobs_of_a_group_leave_its_turns_and_its_slot(peer, pump):
    broker = peer()
    broker.group_caps = {QUEUE: 1}
    refs = broker.enqueue_jobs([grouped(n, "a") for n in range(3)] + [grouped(0, "b")], dedup_ttl=LONG_TTL)
    assert broker.cancel_job(refs[3].id) == CancelOutcome.CANCELLED  # b's only job: b leaves the rotation
    assert broker.delete_job(refs[2].id)
    assert broker.queue_counts(QUEUE).waiting == 2  # grouped jobs count as waiting, as any other
    p = pump(broker, prefetch=3)
    first = p.receive()
    assert first.args[0] == {"n": 0, "g": "a"}
    p.nothing(within=0.5)
    assert broker.start_job(first) == 1
    assert broker.cancel_job(refs[0].id) == CancelOutcome.REQUESTED
    assert broker.cancel_outcome(first, "JobCancelled: stopped")  # its holder ends it: the slot is free
    assert p.receive().args[0] == {"n": 1, "g": "a"}
    p.nothing(within=0.5)
    assert broker.queue_counts(QUEUE).waiting == 0


# Within a group, the queue's rank holds (priority with aging, FIFO within a priority), as in the default group.


@pytest.mark.needs("groups")
def test_within_a_group_a_higher_priority_job_is_taken_first_fifo_within_a_priority(broker, pump):
    priorities = [0, 9, 0, 9, 5, 0]
    broker.enqueue_jobs([grouped(n, "a", p) for n, p in enumerate(priorities)], dedup_ttl=LONG_TTL)
    for n, p in enumerate([9, 0, 9]):  # a second call: later, and after the first call's jobs of each priority
        broker.enqueue_jobs([grouped(10 + n, "a", p)], dedup_ttl=LONG_TTL)
    assert drain(broker, pump(broker), 9) == [1, 3, 10, 12, 4, 0, 2, 5, 11]


@pytest.mark.needs("groups")
def test_within_a_group_aging_lets_an_old_priority_0_job_pass_newer_priority_9_jobs(broker, pump):
    broker.priority_aging = 0.05  # one level is worth 50 ms of waiting: nine are 450 ms
    broker.enqueue_jobs([grouped(0, "a")], dedup_ttl=LONG_TTL)
    time.sleep(0.6)  # more than nine levels' worth
    broker.enqueue_jobs([grouped(1, "a", 9), grouped(2, "a", 9), grouped(3, "a")], dedup_ttl=LONG_TTL)
    assert drain(broker, pump(broker), 4) == [0, 1, 2, 3], "the old job first, then the 9s before the new 0"


@pytest.mark.needs("groups")
def test_groups_are_still_served_in_turn_whatever_their_priorities(broker, pump):
    broker.enqueue_jobs([grouped(n, "a", 9) for n in range(20)], dedup_ttl=LONG_TTL)
    broker.enqueue_jobs([grouped(n, "b") for n in range(2)], dedup_ttl=LONG_TTL)
    served = drain(broker, pump(broker, prefetch=1), 6, "g")
    assert served.count("b") == 2, served


@pytest.mark.needs("groups", "hand_back")
def test_a_job_handed_back_keeps_its_place_in_its_group(broker, pump):
    for n, priority in enumerate([0, 4, 4]):  # one call each: a batch's jobs are ready at one time, a tie
        broker.enqueue_jobs([grouped(n, "a", priority)], dedup_ttl=LONG_TTL)
    p = pump(broker, prefetch=1)
    taken = p.receive()
    assert taken.args[0]["n"] == 1
    p.requeue([taken])
    assert drain(broker, p, 3) == [1, 2, 0], "back in its place: before its later peer of priority 4"


@pytest.mark.needs("groups")
def test_a_retried_job_of_a_group_ranks_by_when_it_became_ready_again(broker, pump):
    broker.enqueue_jobs([grouped(0, "a", 5), grouped(1, "a", 5), grouped(2, "a")], dedup_ttl=LONG_TTL)
    p = pump(broker, prefetch=1)
    first = p.receive()
    assert first.args[0]["n"] == 0
    broker.start_job(first)
    retry(broker, p, first, "boom", 100)  # ready again after its delay: behind its peer of priority 5
    record_in(broker, first.message_id, "waiting")
    assert drain(broker, p, 3) == [1, 0, 2], "ready again later, still before the priority-0 job"


# Weighted shares: a group's weight is its turns per round (1 by default, stored by set_group_weight; the
# queue's settings' weights, broker.group_weights, win). Weights only pick the group: the claim is the same.


def test_every_broker_stores_a_groups_weight_and_forgets_it_at_1(broker):
    # Inline serves no group apart, but keeps and reports a weight as the others do.
    assert broker.stored_group_weights(QUEUE) == {}
    broker.set_group_weight(QUEUE, "vip", 3)
    broker.set_group_weight(QUEUE, "user:42", 2)
    assert broker.stored_group_weights(QUEUE) == {"user:42": 2, "vip": 3}
    assert broker.stored_group_weights(OTHER_QUEUE) == {}
    broker.set_group_weight(QUEUE, "vip", 1)  # back to every group's default
    assert broker.stored_group_weights(QUEUE) == {"user:42": 2}
    broker.group_weights = {QUEUE: {"user:42": 5, "gold": 4}}
    assert broker.effective_group_weights(QUEUE) == {"gold": 4, "user:42": 5}, "the settings' weights win"


@pytest.mark.needs("groups")
def test_a_group_of_weight_3_gets_three_turns_to_a_group_of_weight_1s(broker, pump):
    broker.set_group_weight(QUEUE, "a", 3)
    broker.enqueue_jobs([grouped(n, "a") for n in range(40)] + [grouped(n, "b") for n in range(40)], dedup_ttl=LONG_TTL)
    served = drain(broker, pump(broker, prefetch=1), 24, "g")
    assert 17 <= served.count("a") <= 19, served  # 18 of 24 at 3:1
    # Turns, not a burst: b is served in every stretch of eight.
    assert all("b" in served[i : i + 8] for i in range(0, 24, 8)), served


@pytest.mark.needs("groups")
def test_the_queues_settings_weights_win_over_the_stored_ones(broker, pump):
    broker.set_group_weight(QUEUE, "a", 3)
    broker.group_weights = {QUEUE: {"a": 1, "b": 3}}
    broker.enqueue_jobs([grouped(n, "a") for n in range(40)] + [grouped(n, "b") for n in range(40)], dedup_ttl=LONG_TTL)
    served = drain(broker, pump(broker, prefetch=1), 24, "g")
    assert 17 <= served.count("b") <= 19, served


@pytest.mark.needs("groups")
def test_a_group_back_from_idle_banks_no_turns(broker, pump):
    # a runs alone for a while; b, new then, gets its share from then on, not every turn until it has caught up.
    broker.set_group_weight(QUEUE, "b", 2)
    broker.enqueue_jobs([grouped(n, "a") for n in range(60)], dedup_ttl=LONG_TTL)
    p = pump(broker, prefetch=1)
    assert drain(broker, p, 20, "g") == ["a"] * 20
    broker.enqueue_jobs([grouped(n, "b") for n in range(30)], dedup_ttl=LONG_TTL)
    served = drain(broker, p, 15, "g")
    assert 8 <= served.count("b") <= 11, served  # 10 of 15 at 2:1, not 15


@pytest.mark.needs("groups")
def test_a_capped_weighted_group_takes_no_more_than_its_cap(peer, pump):
    broker = peer()
    broker.group_caps = {QUEUE: 1}
    broker.set_group_weight(QUEUE, "a", 5)
    broker.enqueue_jobs([grouped(n, "a") for n in range(4)] + [grouped(n, "b") for n in range(4)], dedup_ttl=LONG_TTL)
    p = pump(broker, prefetch=4)
    got = [p.receive(), p.receive()]
    p.nothing(within=0.5)  # one of a, one of b: a's weight gives it turns, not slots
    assert sorted(d.args[0]["g"] for d in got) == ["a", "b"]

"""The fence of a job's own effects: each delivery's number, whether it is current, and (postgres)
the job's completion inside the caller's transaction, only while its delivery is current."""

from __future__ import annotations

import psycopg
import pytest

from conveyor.brokers.postgres.jobs import CONNECTION_SLOTS
from conveyor.errors import DeliveryFenced
from tests.contract.conftest import LEASE
from tests.contract.drive import QUEUE, enqueue, eventually, record_in


def _recover(rescuer, job_id):
    eventually(lambda: job_id in rescuer.maintain().get(QUEUE, []), 8 * LEASE, f"recovery of {job_id}")


@pytest.mark.topology
def test_a_delivery_is_current_while_it_runs_and_after_it_completed_the_job(broker, pump):
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    delivered = consumer.receive()
    assert isinstance(broker.delivery(delivered), int) and broker.delivery(delivered) >= 1
    broker.start_job(delivered)
    assert broker.is_current(delivered)
    consumer.ack(delivered)
    record_in(broker, ref.id, "completed")
    assert broker.is_current(delivered), "the delivery that completed the job owned it"


@pytest.mark.topology
def test_a_message_no_consumer_handed_out_has_no_delivery(broker):
    from tests.contract.drive import message

    assert broker.delivery(message({"n": 1})) is None


@pytest.mark.topology
@pytest.mark.needs("recovery", "fence")
def test_a_taken_back_delivery_is_no_longer_current_and_the_next_one_has_a_larger_number(broker, peer, pump, hang):
    ref = enqueue(broker, {"n": 1})
    dying = pump(broker)
    stale = dying.receive()
    broker.start_job(stale)
    hang(broker, dying)
    rescuer = peer()
    _recover(rescuer, ref.id)
    assert not broker.is_current(stale), "taken back: not current even before another worker claims it"
    consumer = pump(rescuer)
    current = consumer.receive()
    assert rescuer.delivery(current) > broker.delivery(stale)
    assert rescuer.start_job(current) == 2
    assert rescuer.is_current(current) and not rescuer.is_current(stale)


def _effects(conn) -> int:
    return conn.execute("SELECT count(*) FROM probe_runs WHERE token = 'effect'").fetchone()[0]


def _write_effect(conn, job_id: str) -> None:
    conn.execute("INSERT INTO probe_runs (token, job_id, attempt, pid) VALUES ('effect', %s, 1, 0)", (job_id,))


@pytest.mark.topology
@pytest.mark.needs("transactional_completion")
def test_a_completion_in_the_callers_transaction_commits_with_its_effect_and_the_ack_after_it_changes_nothing(
    broker, pump, database_url
):
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    delivered = consumer.receive()
    broker.start_job(delivered)
    with psycopg.connect(database_url, autocommit=True) as conn:
        with conn.transaction():
            _write_effect(conn, ref.id)
            broker.complete_in(conn, delivered)
            assert broker.get_job(ref.id).state == "active", "nothing is visible before the caller commits"
        record = broker.get_job(ref.id)
        assert (record.state, record.attempts) == ("completed", 1)
        consumer.ack(delivered)  # the ordinary ack Dramatiq sends after the run
        broker.deliveries.write()
        counts = broker.queue_counts(QUEUE)
        assert (counts.completed_total, counts.active) == (1, 0), "completed once, by the transaction"
        assert _effects(conn) == 1
    assert broker.is_current(delivered)


@pytest.mark.topology
@pytest.mark.needs("transactional_completion")
def test_a_completion_whose_transaction_rolls_back_leaves_the_job_running(broker, pump, database_url):
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    delivered = consumer.receive()
    broker.start_job(delivered)
    with psycopg.connect(database_url, autocommit=True) as conn:
        with pytest.raises(RuntimeError), conn.transaction():
            _write_effect(conn, ref.id)
            broker.complete_in(conn, delivered)
            raise RuntimeError("the caller's code fails after the completion")
        assert broker.get_job(ref.id).state == "active" and _effects(conn) == 0
    consumer.ack(delivered)
    record_in(broker, ref.id, "completed")


@pytest.mark.topology
@pytest.mark.needs("recovery", "fence", "transactional_completion")
def test_a_superseded_delivery_cannot_complete_in_a_transaction_and_its_effect_rolls_back(
    broker, peer, pump, hang, database_url
):
    ref = enqueue(broker, {"n": 1})
    dying = pump(broker)
    stale = dying.receive()
    broker.start_job(stale)
    hang(broker, dying)
    rescuer = peer()
    _recover(rescuer, ref.id)
    consumer = pump(rescuer)
    current = consumer.receive()
    rescuer.start_job(current)
    with psycopg.connect(database_url, autocommit=True) as conn:
        with pytest.raises(DeliveryFenced), conn.transaction():
            _write_effect(conn, ref.id)
            broker.complete_in(conn, stale)  # the stale worker resumes and writes its effect
        assert _effects(conn) == 0, "the stale delivery's effect rolled back"
        assert broker.get_job(ref.id).state == "active", "the current delivery still runs the job"
        with conn.transaction():
            _write_effect(conn, ref.id)
            rescuer.complete_in(conn, current)
        assert _effects(conn) == 1
    record_in(broker, ref.id, "completed")


@pytest.mark.needs("transactional_completion")
def test_a_completion_waits_for_no_other_open_transaction_that_completed_jobs(broker, pump, database_url):
    # A completion keeps its queue total's row locked until its transaction commits; a row
    # picked at random from a few would make the next transaction's completion wait for that commit.
    refs = [enqueue(broker, {"n": n}) for n in range(25)]
    consumer = pump(broker, prefetch=25)
    delivered = [consumer.receive() for _ in refs]
    for one in delivered:
        broker.start_job(one)
    holding, *rest = delivered
    with (
        psycopg.connect(database_url, autocommit=True) as first,
        psycopg.connect(database_url, autocommit=True) as others,
        psycopg.connect(database_url, autocommit=True) as spare,
    ):
        if others.info.backend_pid % CONNECTION_SLOTS == first.info.backend_pid % CONNECTION_SLOTS:
            others = spare  # the one case where two connections share a slot, by design
        with first.transaction():
            broker.complete_in(first, holding)
            others.execute("SET lock_timeout = '1s'")
            for one in rest:
                with others.transaction():  # one each, waiting on no lock of `first`'s
                    broker.complete_in(others, one)
        counts = broker.queue_counts(QUEUE)
    assert (counts.completed_total, counts.active) == (25, 0)

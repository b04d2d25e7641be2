"""Dramatiq's own retries tests (dramatiq 2.2.1, tests/middleware/test_retries.py), on every broker.

A user's or Dramatiq's middleware may re-enqueue the message it was handed,
as Dramatiq's stock ``Retries`` does: ``broker.enqueue(message_proxy, delay=...)``
from ``after_process_message``, where Dramatiq logs and swallows any error.
Each broker must take the proxy as Dramatiq's own brokers do, and treat the
re-enqueue of a delivery that is running as that delivery's retry (a new
message with the same id, fenced by the delivery), exactly as Dramatiq's
RedisBroker schedules it. Ported cases run a real Dramatiq ``Worker`` with the
stock middleware; only the assertions on time are made generous.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.errors import Retry
from dramatiq.middleware import CurrentMessage
from dramatiq.middleware import Retries as StockRetries

from tests.contract.drive import eventually

pytestmark = pytest.mark.needs("stock_records")

#: The queue of the ported tests' actors (the contract's own actors live on others).
RETRY_QUEUE = "stock_retries"


@pytest.fixture
def stock(peer: Callable[[], Any]) -> Iterator[Callable[..., Any]]:
    """``stock(**actor_options)(fn)``: an actor on a broker with Dramatiq's stock Retries, and a running Worker."""
    broker = peer()
    broker.add_middleware(StockRetries())
    broker.add_middleware(CurrentMessage())
    workers: list[Worker] = []

    def actor(**options: Any) -> Callable[[Callable[..., Any]], Any]:
        def declare(fn: Callable[..., Any]) -> Any:
            declared = dramatiq.actor(fn, broker=broker, queue_name=RETRY_QUEUE, **options)
            if not workers:
                workers.append(Worker(broker, queues={RETRY_QUEUE}, worker_timeout=100, worker_threads=4))
                workers[0].start()
            return declared

        return declare

    actor.broker = broker  # type: ignore[attr-defined]
    yield actor
    for worker in workers:
        worker.stop()


def _ended(broker: Any, message: Any, state: str, timeout: float = 20.0) -> None:
    """Wait until the job's record is ``state`` (completed or failed), then let any stray rerun show itself."""
    eventually(
        lambda: (r := broker.get_job(message.message_id)) is not None and r.state == state,
        timeout,
        f"job {message.message_id} to be {state}",
    )
    time.sleep(0.3)


@pytest.mark.topology
def test_actors_retry_on_failure(stock):
    failures, successes = [], []

    @stock(min_backoff=100, max_backoff=500)
    def do_work():
        if sum(failures) == 0:
            failures.append(1)
            raise RuntimeError("First failure.")
        successes.append(1)

    sent = do_work.send()
    _ended(stock.broker, sent, "completed")
    assert (sum(failures), sum(successes)) == (1, 1)


def test_actors_retry_a_max_number_of_times_on_failure(stock):
    attempts = []

    @stock(max_retries=3, min_backoff=100, max_backoff=500)
    def do_work():
        attempts.append(1)
        raise RuntimeError("failure")

    sent = do_work.send()
    _ended(stock.broker, sent, "failed")
    assert sum(attempts) == 4


def test_retry_exceptions_can_specify_a_delay(stock):
    timestamps = [time.monotonic()]

    @stock(max_retries=1)
    def do_work():
        timestamps.append(time.monotonic())
        if len(timestamps) == 2:
            raise Retry(delay=100)

    sent = do_work.send()
    _ended(stock.broker, sent, "completed")
    assert len(timestamps) == 3
    assert timestamps[-1] - timestamps[-2] >= 0.1


@pytest.mark.parametrize("option", ["min_backoff", "max_backoff"])
def test_actors_can_be_assigned_zero_backoff(stock, option):
    timestamps = [time.monotonic()]
    max_retries = 10

    @stock(max_retries=max_retries, **{option: 0})
    def do_work():
        timestamps.append(time.monotonic())
        raise RuntimeError("failure")

    sent = do_work.send()
    _ended(stock.broker, sent, "failed")
    assert len(timestamps) == 2 + max_retries
    assert timestamps[-1] - timestamps[0] < 10


@pytest.mark.parametrize("option", ["min_backoff", "max_backoff"])
def test_actor_messages_can_be_assigned_zero_backoff(stock, option):
    timestamps = [time.monotonic()]
    max_retries = 10

    @stock(min_backoff=10000, max_retries=max_retries)
    def do_work():
        timestamps.append(time.monotonic())
        raise RuntimeError("failure")

    sent = do_work.send_with_options(**{option: 0})
    _ended(stock.broker, sent, "failed")
    assert len(timestamps) == 2 + max_retries
    assert timestamps[-1] - timestamps[0] < 10


@pytest.mark.parametrize("max_retries_message_option", (0, 4))
def test_actors_can_be_assigned_message_max_retries(stock, max_retries_message_option):
    attempts = []

    @stock(max_retries=99, min_backoff=5000, max_backoff=50000)
    def do_work():
        attempts.append(1)
        raise RuntimeError("failure")

    sent = do_work.send_with_options(max_retries=max_retries_message_option, min_backoff=50, max_backoff=500)
    _ended(stock.broker, sent, "failed")
    assert sum(attempts) == 1 + max_retries_message_option


def test_actors_can_conditionally_retry(stock):
    def should_retry(retry_count, exception):
        return retry_count < 3 and isinstance(exception, RuntimeError)

    attempts = []

    @stock(retry_when=should_retry, max_retries=0, min_backoff=100, max_backoff=100)
    def raises_errors(raise_runtime_error):
        attempts.append(1)
        if raise_runtime_error:
            raise RuntimeError("Runtime error")
        raise ValueError("Value error")

    sent = raises_errors.send(False)
    _ended(stock.broker, sent, "failed")
    assert sum(attempts) == 1
    attempts[:] = []
    sent = raises_errors.send(True)
    _ended(stock.broker, sent, "failed")
    assert sum(attempts) == 4


class CustomException(Exception):
    pass


def test_actor_with_throws_does_not_retry(stock):
    attempts = []

    @stock(throws=CustomException)
    def do_work():
        attempts.append(1)
        if sum(attempts) == 1:
            raise CustomException("Expected Failure")

    sent = do_work.send()
    _ended(stock.broker, sent, "failed")
    assert sum(attempts) == 1


def test_message_contains_requeue_time_after_retry(stock):
    requeue_timestamps = []
    max_retries = 2

    @stock(max_retries=max_retries, min_backoff=100, max_backoff=100)
    def do_work():
        current = CurrentMessage.get_current_message()
        if "requeue_timestamp" in current.options:
            requeue_timestamps.append(current.options["requeue_timestamp"])
        raise RuntimeError()

    sent = do_work.send_with_options(delay=100)
    _ended(stock.broker, sent, "failed")
    assert len(requeue_timestamps) == max_retries
    assert requeue_timestamps == sorted(requeue_timestamps) and len(set(requeue_timestamps)) == max_retries
    assert all(t > sent.message_timestamp for t in requeue_timestamps)


def test_on_retry_exhausted_is_sent(stock):
    attempted, called = [], []
    max_retries = 2

    @stock()
    def handle_retries_exhausted(message_data, retry_info):
        called.append(retry_info)

    @stock(max_retries=max_retries, on_retry_exhausted=handle_retries_exhausted.actor_name)
    def do_work():
        attempted.append(1)
        raise Retry(delay=1)

    sent = do_work.send()
    _ended(stock.broker, sent, "failed")
    eventually(lambda: called, 10, "the exhausted handler")
    time.sleep(0.3)
    assert (len(attempted), len(called)) == (max_retries + 1, 1)


def test_on_retry_exhausted_is_not_sent_for_eventual_success(stock):
    attempted, called = [], []

    @stock()
    def handle_retries_exhausted(message_data, retry_info):
        called.append(1)

    @stock(max_retries=2, on_retry_exhausted=handle_retries_exhausted.actor_name)
    def do_work():
        attempted.append(1)
        if len(attempted) < 2:
            raise Retry(delay=1)

    sent = do_work.send()
    _ended(stock.broker, sent, "completed")
    assert (len(attempted), len(called)) == (2, 0)

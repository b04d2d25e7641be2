"""Waking an idle consumer: an enqueue reaches a consumer that would otherwise not look for a minute."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.contract.conftest import PGBOUNCER, REDIS_CLUSTER
from tests.contract.drive import QUEUE, enqueue, eventually

#: Seconds an idle consumer waits between two looks at its queue in this test: far past its deadline.
LONG_POLL = 60.0


def _redis_poll_long(broker: Any, consumer: Any) -> None:
    broker.wait_cap = LONG_POLL  # one BLPOP on the wake-up list may last this long
    consumer.misses = 30  # and the idle backoff has grown past it


def _postgres_poll_long(broker: Any, consumer: Any) -> None:
    broker.poll_seconds = LONG_POLL


#: How each broker's idle consumer is made to look at its queue only every LONG_POLL seconds, and
#: how to see that it has looked once, found nothing and gone to sleep.
POLL_LONG: dict[str, Callable[[Any, Any], None]] = {
    "redis": _redis_poll_long,
    REDIS_CLUSTER: _redis_poll_long,
    "postgres": _postgres_poll_long,
    PGBOUNCER: _postgres_poll_long,
}
IDLE: dict[str, Callable[[Any], bool]] = {
    "redis": lambda consumer: consumer.misses > 30,
    REDIS_CLUSTER: lambda consumer: consumer.misses > 30,
    "postgres": lambda consumer: not consumer.draining,
    PGBOUNCER: lambda consumer: not consumer.draining,
}


@pytest.mark.topology
@pytest.mark.needs("stored_messages")  # inline: an in-process queue hands a put to the get waiting on it
def test_an_idle_consumer_is_woken_by_an_enqueue_not_by_its_poll(broker, broker_name):
    consumer = broker.consume(QUEUE, prefetch=1, timeout=int(2 * LONG_POLL * 1000))
    POLL_LONG[broker_name](broker, consumer)
    received: list[Any] = []

    def consume() -> None:
        while not received:
            message = next(consumer)
            if message is not None:
                received.append(message)

    threading.Thread(target=consume, daemon=True, name="contract-idle-consumer").start()
    eventually(lambda: IDLE[broker_name](consumer), what="the consumer to find its queue empty and sleep")
    time.sleep(0.2)  # well into its sleep, not between its look and its wait
    started = time.monotonic()
    ref = enqueue(broker, {"n": 1})
    eventually(lambda: received, timeout=LONG_POLL / 4, what="the enqueue to wake the idle consumer")
    assert received[0].message_id == ref.id
    assert time.monotonic() - started < LONG_POLL / 4
    consumer.close()

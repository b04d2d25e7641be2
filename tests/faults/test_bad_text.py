"""Jobs whose errors carry a NUL or a lone surrogate: text Postgres refuses and UTF-8 cannot encode.

Any error text must be storable: the retry of such a failure still
happens, its final failure still runs the hook once, and the consumer
keeps serving the jobs behind it.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.checker import Checker
from tests.faults.workload import Producer, mixed
from tests.support.brokers import SERVER_BROKERS

FAULT = "error texts with NUL and lone surrogates"


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_error_texts_with_nul_and_lone_surrogates(world, broker):
    cluster = world(broker, FAULT)
    groups = [cluster.start_workers(name, wait=False) for name in ("a", "b")]
    for group in groups:
        group.wait_ready()
    plan = (
        mixed(25, "nul", bad_text="nul")
        + mixed(25, "surrogate", bad_text="surrogate")
        + mixed(25, "both", bad_text="both")
    )
    producer = Producer(cluster.app, plan, spread=3.0)
    producer.start()
    producer.wait()
    Checker(cluster, plan, fault=FAULT).check(time.time(), producer=producer)

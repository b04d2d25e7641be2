"""Each broker builds its own fleet and rollup stores; a supervisor's store (no broker built) reaches the same data.

The supervisor marks a reaped worker process gone through ``store_without_broker``, built from the
settings by the broker's class; the API reads the registry through the broker's own ``fleet_store``.
Were the two on different data (another Redis namespace, another database), a killed worker would
stay ``alive`` on the Workers page until its heartbeat went late.
"""

from __future__ import annotations

import os

import pytest

from conveyor.brokers.fleet import DIED, WorkerInfo, fleet_store, mark_process_gone, store_without_broker
from conveyor.brokers.rollup import rollup_store
from tests.support.brokers import SERVER_BROKERS
from tests.support.obs_support import broker_app as make_app


@pytest.fixture(params=SERVER_BROKERS)
def app(request):
    app = make_app(request, request.param)
    yield app
    app.close()


def test_a_supervisor_marks_gone_the_worker_the_brokers_own_store_registered(app):
    info = WorkerInfo(
        id="w-supervised", host="host-a", pid=os.getpid() + 100000, queues=["indexing"], threads=1,
        version="test", started_at=None, heartbeat_at=None,
    )  # fmt: skip
    fleet_store(app).beat(info, keep=60)
    supervisor = store_without_broker(app)
    assert supervisor is not None and type(supervisor) is type(fleet_store(app))
    assert mark_process_gone(supervisor, "host-a", info.pid) == ["w-supervised"]
    [seen] = [w for w in fleet_store(app).workers()[1] if w.id == "w-supervised"]
    assert seen.gone_at is not None and seen.gone_reason == DIED


def test_the_stores_are_the_brokers_own_one_per_broker(app):
    kind = app.capabilities.store.capitalize()  # Redis..., Postgres...
    assert type(fleet_store(app)).__name__ == f"{kind}FleetStore" and fleet_store(app) is fleet_store(app)
    assert type(rollup_store(app)).__name__ == f"{kind}RollupStore" and rollup_store(app) is rollup_store(app)

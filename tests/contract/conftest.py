"""The broker contract: every broker of ``ALL_BROKERS``, built bare, driven through its interface.

Each test takes ``broker`` and runs once per broker: a ``ConveyorBroker``
with no middleware and the contract's three actors declared, on this test's
private Redis (flushed) or its own Postgres database. ``peer()`` builds a
second broker on the same store (another worker process, for recovery and
the fence); ``pump(broker, queue)`` runs the broker's consumer of a queue on
a thread (see ``drive.Pump``). Leases and heartbeat timeouts are a second
or so, so a test of recovery waits seconds, never minutes.

What a broker lacks is what its class declares it lacks, in its
:class:`~conveyor.brokers.base.Capabilities` (the reasons are written there), and
what only a deployment of it lacks (a Redis Cluster) or only this harness cannot
drive is in :data:`LACKS`, with the reason: a test that needs a capability says so
with ``@pytest.mark.needs(...)`` and is skipped on the brokers that lack it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest

from conveyor.backends import BACKENDS
from conveyor.brokers.base import Capabilities
from conveyor.settings import Settings
from tests.contract.drive import JOB, OTHER_JOB, OTHER_QUEUE, QUEUE, URGENT_JOB, Pump
from tests.support.brokers import ALL_BROKERS

#: The broker class behind each name the contract runs (the deployments run their broker's class).
PGBOUNCER = "postgres+pgbouncer"  # the postgres broker through a private PgBouncer in transaction pooling mode
REDIS_CLUSTER = "redis-cluster"  # the redis broker on a private three-primary Redis Cluster (``redis+cluster://``)
BROKER_OF = {**{name: name for name in ALL_BROKERS}, PGBOUNCER: "postgres", REDIS_CLUSTER: "redis"}

#: What a run lacks beyond what its broker class declares, and why: a deployment's limit, or this harness's.
LACKS: dict[str, dict[str, str]] = {
    "inline": {
        "hand_back": "nothing takes an inline message back from the one process that holds it",
        "groups": "one process runs every inline job in queue order: it keeps a job's group and serves none apart",
        "stock_records": "inline records move to active at conveyor's start_job: with Dramatiq's stock middleware "
        "alone (no conveyor Retries) they never leave waiting, so a test cannot wait on them",
    },
    # Each queue's keys carry the queue as their hash tag, so what spans queues is what it lacks.
    REDIS_CLUSTER: {
        "cross_queue_keys": "a queue's keys live on its own slot: a dedup key is held within its queue, and a batch "
        "spanning queues is one atomic call per queue",
    },
}


def lacks(name: str, capability: str) -> str | None:
    """Why the run ``name`` lacks ``capability`` (a field of Capabilities, or a key of LACKS); None if it has it."""
    capabilities = BACKENDS[BROKER_OF[name]].capabilities  # type: ignore[index]  # a BrokerName by construction
    if capability in Capabilities.__dataclass_fields__:
        if not getattr(capabilities, capability):
            return f"its broker class declares {capability}=False (see its capabilities)"
        return None
    return LACKS.get(name, {}).get(capability)


#: The two topologies: the same broker code as postgres and redis, behind a pooler or spread over a cluster.
#: They run only the tests marked ``@pytest.mark.topology``, those whose outcome the topology can change: a
#: transaction or session state the pooler may split across server connections (the caller's transaction,
#: locks and LISTEN behind a claim, the lease, the fence, racing keys), or keys the cluster puts on other slots
#: and nodes (batches, delay and promotion, recovery's and the counts' scans, a dedup key, a stored message or
#: cancel). The rest drive the same SQL and Lua by the same path as one marked test does: 35 of 69 tests are
#: marked, 74 of 360 contract runs fewer: the suite took 310 s with every test on them, 234 s with the marked
#: ones (PgBouncer 100 -> 51 s, the cluster 50 -> 27 s; 2 shared cores). ``CONTRACT_ALL_TOPOLOGIES=1`` runs every test on them too (a pooler or cluster finding: mark the
#: test that would have shown it).
TOPOLOGIES = (PGBOUNCER, REDIS_CLUSTER)

#: Seconds without a heartbeat before a worker's jobs may be recovered (Redis timeout, Postgres lease).
LEASE = 1.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs(capability): skipped on the brokers that lack it (their Capabilities, or LACKS)"
    )
    config.addinivalue_line(
        "markers",
        "topology: also run on the pooler and cluster brokers (TOPOLOGIES), where they can change the outcome",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``broker_name``: every broker, and the TOPOLOGIES too for a test marked ``topology``."""
    if "broker_name" not in metafunc.fixturenames:
        return
    names = list(ALL_BROKERS)
    if metafunc.definition.get_closest_marker("topology") or os.environ.get("CONTRACT_ALL_TOPOLOGIES") == "1":
        names += TOPOLOGIES
    metafunc.parametrize("broker_name", names, indirect=True)


def _declare_actors(broker: Any) -> None:
    def run(payload: dict) -> None:  # never called: the contract drives deliveries itself
        raise AssertionError("the contract suite runs no actor")

    dramatiq.actor(run, broker=broker, actor_name=JOB, queue_name=QUEUE, priority=10)
    dramatiq.actor(run, broker=broker, actor_name=URGENT_JOB, queue_name=QUEUE, priority=0)
    dramatiq.actor(run, broker=broker, actor_name=OTHER_JOB, queue_name=OTHER_QUEUE)


def _builder(request: pytest.FixtureRequest, name: str) -> Callable[[], Any]:
    """A function that builds one more broker ``name`` on this test's store."""
    hooks = request.getfixturevalue("final_failures")

    def on_dead(broker: Any, message: Any, error: str) -> None:
        hooks.append((message.message_id, message.actor_name, error))

    if name in ("redis", REDIS_CLUSTER):
        from conveyor.brokers.redis import RedisBroker

        url = request.getfixturevalue("redis_url" if name == "redis" else "redis_cluster_url")
        settings = Settings(broker="redis", redis_url=url, heartbeat_timeout=LEASE, maintenance_interval=0.1)

        def build() -> Any:
            return RedisBroker(
                url=url,
                middleware=[],
                namespace="contract",
                heartbeat_timeout=LEASE,
                retention=3600,
                settings=settings,
                on_dead=on_dead,
            )

        return build
    if name == "postgres":
        from conveyor.brokers.postgres import PostgresBroker

        url = request.getfixturevalue("database_url")
        settings = Settings(
            broker="postgres", database_url=url, pg_lease_seconds=LEASE, pg_poll_seconds=0.2, pg_recovery_seconds=0.1
        )
        return lambda: PostgresBroker(url, middleware=[], settings=settings, on_dead=on_dead)
    if name == PGBOUNCER:
        from conveyor.brokers.postgres import PostgresBroker

        direct = request.getfixturevalue("database_url")
        bouncer = request.getfixturevalue("pgbouncer")
        url = bouncer.url(direct.rsplit("/", 1)[1])
        settings = Settings(
            broker="postgres",
            database_url=url,
            database_pooled=True,
            listen_database_url=direct,
            pg_lease_seconds=LEASE,
            pg_poll_seconds=0.2,
            pg_recovery_seconds=0.1,
        )
        return lambda: PostgresBroker(url, middleware=[], settings=settings, on_dead=on_dead)
    if name == "inline":
        from conveyor.brokers.inline import InlineBroker

        return lambda: InlineBroker(middleware=[])
    raise AssertionError(f"the contract does not know how to build broker {name!r}: add it to _builder")


#: How a worker process of each broker stops heartbeating without handing anything back (it hangs, or is
#: SIGKILLed): besides its consumer, which ``Pump.freeze`` stops. Redis heartbeats only with its calls.
SILENCE: dict[str, Callable[[Any], None]] = {
    "redis": lambda broker: None,
    REDIS_CLUSTER: lambda broker: None,
    "postgres": lambda broker: broker.listener.stop(),
    PGBOUNCER: lambda broker: broker.listener.stop(),
}


@pytest.fixture
def final_failures() -> list[tuple[str, str, str]]:
    """(job id, job, error) of each final-failure hook a broker ran by itself (``on_dead``: recovery, malformed)."""
    return []


def _store_redis(broker: Any, job_id: str, data: bytes) -> None:
    queue = broker.get_job(job_id).queue
    keys = broker.keys.scope(queue)
    rid = broker.client.hget(keys.job(job_id), "rid").decode()
    broker.client.hset(keys.messages(queue), rid, data)


def _store_postgres(broker: Any, job_id: str, data: bytes) -> None:
    import psycopg

    with psycopg.connect(broker.database_url) as conn:
        conn.execute("UPDATE conveyor_jobs SET message = %s::jsonb WHERE id = %s", (data.decode(), job_id))


#: How to overwrite the message a job's waiting delivery is stored as (a newer producer's format, say).
STORE: dict[str, Callable[[Any, str, bytes], None]] = {
    "redis": _store_redis,
    REDIS_CLUSTER: _store_redis,
    "postgres": _store_postgres,
    PGBOUNCER: _store_postgres,
}


@pytest.fixture
def store_message(broker_name: str) -> Callable[[Any, str, bytes], None]:
    """``store_message(broker, job_id, data)``: the job's waiting message is now ``data``, as stored bytes."""
    return STORE[broker_name]


@pytest.fixture
def broker_name(request: pytest.FixtureRequest) -> str:
    """The broker under contract (parametrized by :func:`pytest_generate_tests`)."""
    name = request.param
    for marker in request.node.iter_markers("needs"):
        for capability in marker.args:
            reason = lacks(name, capability)
            if reason:
                pytest.skip(f"{name} has no {capability}: {reason}")
    return name


@pytest.fixture
def peer(
    request: pytest.FixtureRequest, broker_name: str, clean_env: pytest.MonkeyPatch
) -> Iterator[Callable[[], Any]]:
    """Factory: one more broker on this test's store (another worker process); all are closed after."""
    build = _builder(request, broker_name)
    made: list[Any] = []

    def make() -> Any:
        broker = build()
        _declare_actors(broker)
        made.append(broker)
        return broker

    yield make
    for broker in reversed(made):
        broker.close()


@pytest.fixture
def broker(peer: Callable[[], Any]) -> Any:
    """The broker under contract."""
    return peer()


@pytest.fixture
def pump(peer: Callable[[], Any]) -> Iterator[Callable[..., Pump]]:
    """Factory: ``pump(broker, queue=QUEUE, prefetch=1)`` consumes ``queue`` (and its delay queue, if any).

    Pumps stop before the brokers close (``peer`` was set up first, so it is torn down last).
    """
    pumps: list[Pump] = []

    def start(broker: Any, queue: str = QUEUE, prefetch: int = 1) -> Pump:
        pumps.append(Pump(broker, queue, prefetch=prefetch))
        return pumps[-1]

    yield start
    for started in reversed(pumps):
        started.close()


@pytest.fixture
def hang(broker_name: str) -> Callable[[Any, Pump], None]:
    """``hang(broker, pump)``: that worker stops consuming and heartbeating, and hands back nothing."""

    def stop(broker: Any, consumer: Pump) -> None:
        consumer.freeze()
        SILENCE[broker_name](broker)

    return stop

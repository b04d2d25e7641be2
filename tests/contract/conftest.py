"""The broker contract: every broker of ``ALL_BROKERS``, built bare, driven through its interface.

Each test takes ``broker`` and runs once per broker: a ``ConveyorBroker``
with no middleware and the contract's three actors declared, on this test's
private Redis (flushed) or its own Postgres database. ``peer()`` builds a
second broker on the same store (another worker process, for recovery and
the fence); ``pump(broker, queue)`` runs the broker's consumer of a queue on
a thread (see ``drive.Pump``). Leases and heartbeat timeouts are a second
or so, so a test of recovery waits seconds, never minutes.

What a broker truly lacks is in :data:`LACKS`, with the reason, and nowhere
else: a test that needs a capability says so with ``@pytest.mark.needs(...)``
and is skipped, with that reason, on the brokers that lack it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest

from conveyor.settings import Settings
from tests.contract.drive import JOB, OTHER_JOB, OTHER_QUEUE, QUEUE, URGENT_JOB, Pump
from tests.support.brokers import ALL_BROKERS

#: Capabilities a broker does not have, and why; the only place a contract test is skipped.
LACKS: dict[str, dict[str, str]] = {
    "inline": {
        "stored messages": "an inline message never leaves the process that encoded it: it always decodes",
        "recovery": "one process holds every inline job: no worker can die and leave jobs held behind it",
        "fence": "no inline delivery is ever superseded: a message is handed to one thread of the one process",
        "transactional_completion": "inline jobs live in the process's memory, not in a database a transaction spans",
        "priority": "a queue is Dramatiq's in-memory FIFO; actor priority orders only a worker's work queue",
        "groups": "one process runs every inline job in queue order: it keeps a job's group and serves none apart",
        "stock_records": "inline records move to active at conveyor's start_job: with Dramatiq's stock middleware "
        "alone (no conveyor Retries) they never leave waiting, so a test cannot wait on them",
    },
    "redis": {
        "transactional_completion": "Redis jobs are not rows of the Postgres database the caller's transaction is on",
        "priority": "a queue is one FIFO list; actor priority orders only a worker's work queue (Dramatiq's design)",
    },
}

#: The postgres broker again, through a private PgBouncer in transaction pooling mode
#: (CONVEYOR_DATABASE_POOLED, LISTEN on a direct connection): it lacks what postgres lacks.
PGBOUNCER = "postgres+pgbouncer"
LACKS[PGBOUNCER] = LACKS.get("postgres", {})

#: The redis broker again, on a private three-primary Redis Cluster (``redis+cluster://``): each queue's keys
#: carry the queue as their hash tag, so what spans queues is what it lacks.
REDIS_CLUSTER = "redis-cluster"
LACKS[REDIS_CLUSTER] = {
    **LACKS["redis"],
    "cross_queue_keys": "a queue's keys live on its own slot: a dedup key is held within its queue, and a batch "
    "spanning queues is one atomic call per queue",
}

#: Seconds without a heartbeat before a worker's jobs may be recovered (Redis timeout, Postgres lease).
LEASE = 1.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs(capability): skipped on the brokers LACKS says lack it")


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


@pytest.fixture(params=[*ALL_BROKERS, PGBOUNCER, REDIS_CLUSTER])
def broker_name(request: pytest.FixtureRequest) -> str:
    name = request.param
    for marker in request.node.iter_markers("needs"):
        for capability in marker.args:
            reason = LACKS.get(name, {}).get(capability)
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

"""Fixtures of the fault suite: durable private servers, one world per test, the report at the end.

The fault suite has servers of its own, configured the way production is
(the session's shared servers trade durability for speed): Redis with
``appendonly yes`` + ``appendfsync always``, Postgres with ``fsync``,
``synchronous_commit`` and ``full_page_writes`` on. Tests crash them for
real; each test gets its own database copied from a migrated template and
a flushed Redis.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path

import pytest
import redis as redis_lib

from tests.faults import report
from tests.faults.harness import Cluster, fault_settings
from tests.faults.netns import NetworkNamespace
from tests.support.servers import PostgresServer, RedisServer

TEMPLATE = "conveyor_fault_template"
SQL = Path(__file__).with_name("faults.sql")

_FAILED = pytest.StashKey[str]()
_templates: set[int] = set()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and call.excinfo is not None:
        item.stash[_FAILED] = f"{call.excinfo.type.__name__}: {call.excinfo.value}"


@pytest.fixture(scope="session", autouse=True)
def fault_report():
    """Writes docs/reliability.md once the session's fault tests are over (see report.write)."""
    started = time.monotonic()
    yield
    if report.ROWS or report.CAMPAIGN:
        path = report.write(report.ROWS, elapsed=time.monotonic() - started, campaign=report.CAMPAIGN)
        if path:
            print(f"\nfault suite: wrote {path}")


@pytest.fixture(scope="session")
def fault_redis():
    with RedisServer(tempfile.mkdtemp(prefix="conveyor-fault-redis-"), durable=True) as server:
        yield server


@pytest.fixture(scope="session")
def fault_pg():
    # mkdtemp: as root the server runs as `postgres`, which cannot enter pytest's 0700 tmp dirs.
    with PostgresServer(tempfile.mkdtemp(prefix="conveyor-fault-pg-"), settings=PostgresServer.DURABLE) as server:
        yield server


def ensure_template(pg: PostgresServer) -> str:
    """The migrated database (plus the fault tables) that each test's database is copied from."""
    from conveyor.platform.blueprint import jobs as platform
    from conveyor.schema.migrate import migrate

    if id(pg) not in _templates:
        pg.drop_database(TEMPLATE)
        pg.create_database(TEMPLATE)
        migrate(pg.url(TEMPLATE), [platform])
        with pg.connect(TEMPLATE) as conn:
            conn.execute(SQL.read_text())
        pg.terminate_connections(TEMPLATE)
        _templates.add(id(pg))
    return TEMPLATE


@pytest.fixture
def world(request, fault_pg, fault_redis, tmp_path):
    """Factory: ``world(broker, fault, pg=..., redis=..., host=..., **settings) -> Cluster``.

    ``host`` is the address the workers' URLs name (the servers must listen
    there). Everything made is stopped and dropped after the test; a test
    that failed before its checker recorded a row gets an error row.
    """
    made: list[tuple[Cluster, PostgresServer, str]] = []

    def make(
        broker: str, fault: str, *, pg: PostgresServer | None = None, redis: RedisServer | None = None, **overrides
    ) -> Cluster:
        pg, redis = pg or fault_pg, redis or fault_redis
        for server in (pg, redis):
            if not server.is_running:  # an earlier test crashed it and failed before restarting it
                server.start()
        template = ensure_template(pg)
        name = f"fault_{uuid.uuid4().hex[:12]}"
        pg.create_database(name, template=template)
        client = redis_lib.Redis.from_url(redis.url)
        try:
            client.flushall()
        finally:
            client.close()
        settings = fault_settings(broker, redis.url if broker == "redis" else None, pg.url(name), **overrides)
        env = {f"CONVEYOR_{name.upper()}": str(value) for name, value in overrides.items()}
        cluster = Cluster(settings, tmp_path / f"{broker}-{len(made)}", env)
        cluster.fault = fault
        made.append((cluster, pg, name))
        return cluster

    yield make

    failed = request.node.stash.get(_FAILED, None)
    for cluster, pg, name in made:
        try:
            cluster.close()
        finally:
            if failed:
                report.record_error(cluster.fault, cluster.settings.broker_name, failed)
            if not pg.is_running:
                pg.start()
            pg.drop_database(name)


@pytest.fixture(scope="module")
def namespace():
    """A worker host of its own (see netns.py), removed after the module."""
    ns = NetworkNamespace()
    try:
        yield ns
    finally:
        ns.close()


@pytest.fixture(scope="module")
def ns_servers(namespace):
    """Durable servers that listen on loopback and on the veth address."""
    pg = PostgresServer(
        tempfile.mkdtemp(prefix="conveyor-fault-pg-ns-"),
        settings={**PostgresServer.DURABLE, "listen_addresses": f"127.0.0.1,{namespace.host_address}"},
    )
    try:
        pg.trust(f"{namespace.ns_address}/32")
        redis = RedisServer(
            tempfile.mkdtemp(prefix="conveyor-fault-redis-ns-"),
            durable=True,
            bind=("127.0.0.1", namespace.host_address),
        )
        try:
            yield pg, redis
        finally:
            redis.close()
    finally:
        pg.close()

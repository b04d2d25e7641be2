"""Fixtures: private servers for the session, clean state for every test.

One Redis and one PostgreSQL server start per test session, on first use (see
`tests/support/servers.py`): a test that takes none of their fixtures starts
none, so `pytest tests/unit` runs without a server. Each test gets a flushed
Redis and its own database copied from a migrated template, dropped afterwards.

At import, before any test module, this file removes conveyor's configuration
(every `CONVEYOR_*` variable, `REDIS_URL`, `DATABASE_URL`,
`JOB_FAILURE_WEBHOOK_URL`) from the process environment, so no test depends on
the caller's shell; a test that needs a value sets it through `clean_env`. Job
types live in blueprints, one per job module, so no test can change another's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.cluster import RedisCluster
from tests.support.servers import PgBouncerServer, PostgresServer, RedisServer
from tests.support.waiting import wait_for

#: The migrated database every test database is copied from.
TEMPLATE_DB = "conveyor_template"

#: Variables that configure conveyor: removed from the environment at import, and again by `clean_env`.
CONFIG_VARS = ("REDIS_URL", "DATABASE_URL", "JOB_FAILURE_WEBHOOK_URL")
CONFIG_PREFIX = "CONVEYOR_"
#: OpenTelemetry's variables: a collector's endpoint set on the host would turn tracing on in every App.
OTEL_PREFIX = "OTEL_"


def is_config_var(name: str) -> bool:
    return name in CONFIG_VARS or name.startswith((CONFIG_PREFIX, OTEL_PREFIX))


for _name in [n for n in os.environ if is_config_var(n)]:
    del os.environ[_name]


#: Fixtures that start a server: a unit test (``tests/unit``) may use none of them.
SERVER_FIXTURES = frozenset({"redis_server", "redis_cluster", "pg_server"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The unit layer starts no server: a unit test that needs one (even through another fixture) is refused."""
    unit = Path(__file__).parent / "unit"
    for item in items:
        if Path(str(item.path)).is_relative_to(unit) and SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            raise pytest.UsageError(f"{item.nodeid} is a unit test but needs a server: it belongs in tests/integration")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes more than a few seconds; deselect with -m 'not slow'")
    config.addinivalue_line("markers", "chromium: drives a headless Chromium (needs chromium and chromium-driver)")


# -- Redis --------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A private redis-server for the whole session."""
    with RedisServer(tempfile.mkdtemp(prefix="conveyor-redis-")) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the session's Redis, emptied (FLUSHALL) for this test.

    Restarts the server first if an earlier test stopped or killed it.
    """
    import redis

    if not redis_server.is_running:
        redis_server.start()
    client = redis.Redis.from_url(redis_server.url)
    try:
        client.flushall()
        # Persistent, as production should run (the broker names a Redis that is not); the restart
        # after a kill still starts without it, so tests of the server itself see a crash forget.
        if client.config_get("appendonly").get("appendonly") != "yes":
            client.config_set("appendonly", "yes")
            # Turning it on starts writing the initial AOF in the background, and until that is
            # done Redis refuses a SIGTERM ("Writing initial AOF, can't exit"): a test that stops
            # the server would wait out the stop timeout and kill it. It takes milliseconds here.
            wait_for(
                lambda: _initial_aof_written(client), timeout=30, message="Redis to write its initial append-only file"
            )
    finally:
        client.close()
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """A private three-primary Redis Cluster for the whole session (tests/support/cluster.py)."""
    with RedisCluster() as cluster:
        yield cluster


@pytest.fixture
def redis_cluster_url(redis_cluster: RedisCluster) -> str:
    """``redis+cluster://…`` of the session's cluster, every node emptied (FLUSHALL) for this test."""
    redis_cluster.flush()
    return redis_cluster.url


def _initial_aof_written(client) -> bool:
    info = client.info("persistence")
    return not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]


# -- PostgreSQL ---------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """A private PostgreSQL cluster for the whole session."""
    # mkdtemp, not tmp_path_factory: as root the server runs as `postgres`,
    # which cannot enter pytest's 0700 /tmp/pytest-of-root.
    with PostgresServer(tempfile.mkdtemp(prefix="conveyor-pg-")) as server:
        yield server


def _ensure_running(server: PostgresServer) -> None:
    if not server.is_running:  # an earlier test stopped or crashed it
        server.start()


@pytest.fixture(scope="session")
def pg_template(pg_server: PostgresServer) -> str:
    """Name of a database with every migration applied, to copy per test."""
    from conveyor.platform.blueprint import jobs as platform
    from conveyor.schema.migrate import migrate

    pg_server.drop_database(TEMPLATE_DB)
    pg_server.create_database(TEMPLATE_DB)
    migrate(pg_server.url(TEMPLATE_DB), [platform])  # the platform's tables too: most tests' Apps include it
    with pg_server.connect(TEMPLATE_DB) as conn:  # the tables tests/support/jobs.py writes to
        conn.execute((Path(__file__).parent / "support" / "jobs.sql").read_text())
    # A copy fails while anyone is connected to its source.
    pg_server.terminate_connections(TEMPLATE_DB)
    return TEMPLATE_DB


@pytest.fixture(scope="session")
def pgbouncer(pg_server: PostgresServer) -> Iterator[PgBouncerServer]:
    """A private PgBouncer (transaction pooling) in front of the session's Postgres: ``pgbouncer.url(dbname)``."""
    with PgBouncerServer(pg_server) as server:
        yield server


@pytest.fixture
def make_database(pg_server: PostgresServer) -> Iterator[Callable[..., str]]:
    """Factory: `make_database(template=None) -> url` of a new database.

    Every database it makes is dropped after the test.
    """
    made: list[str] = []

    def make(template: str | None = None) -> str:
        _ensure_running(pg_server)
        name = f"test_{uuid.uuid4().hex}"
        pg_server.create_database(name, template=template)
        made.append(name)
        return pg_server.url(name)

    yield make

    _ensure_running(pg_server)
    for name in made:
        pg_server.drop_database(name)


@pytest.fixture
def database_url(make_database: Callable[..., str], pg_template: str) -> str:
    """URL of this test's own migrated database (`test_<uuid>`), dropped after."""
    return make_database(template=pg_template)


# -- embedded Postgres --------------------------------------------------------


@pytest.fixture
def embedded_data_dir() -> Iterator[Path]:
    """A data directory for `conveyor.embedded` (CONVEYOR_DATA_DIR), removed after.

    Made with mkdtemp under /tmp, not tmp_path: as root the embedded server
    runs as another user, who cannot enter pytest's 0700 /tmp/pytest-of-root.
    Its server is stopped after the test, whoever started it.
    """
    from conveyor.embedded import stop_embedded

    path = Path(tempfile.mkdtemp(prefix="conveyor-data-"))
    try:
        yield path
    finally:
        stop_embedded(path)
        shutil.rmtree(path, ignore_errors=True)


# -- environment --------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Remove conveyor's configuration variables for this test (any set since the import stripped them).

    Returns the monkeypatch, so the test can `clean_env.setenv(...)` exactly
    what it means to configure; everything is restored afterwards.
    """
    for name in list(os.environ):
        if is_config_var(name):
            monkeypatch.delenv(name)
    return monkeypatch


# -- apps and worker processes, for modules that define a `settings` fixture ---


@pytest.fixture
def app(settings):
    """An App on the module's `settings`, closed after the test."""
    from conveyor.app import App

    app = App(settings)
    yield app
    app.close()


@pytest.fixture
def workers(settings, tmp_path):
    """Factory: `workers(queues, processes=1, **env)` starts `conveyor worker`; all are stopped after."""
    from tests.support.harness import WorkerProcess

    started = []

    def start(queues: str, processes: int = 1, **env):
        worker = WorkerProcess(settings, queues, processes, log=tmp_path / f"worker-{len(started)}.log", **env)
        started.append(worker)
        return worker

    yield start
    for worker in started:  # all drain together: each takes a process shutdown
        worker.send_stop()
    for worker in started:
        worker.terminate()

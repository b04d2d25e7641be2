"""The test servers and fixtures themselves: crash, restart, isolation."""

from __future__ import annotations

import tempfile

import psycopg
import pytest
import redis

from tests.support.servers import PostgresServer, ServerStartError

SERVERS_TEMPLATE = "servers_template"


@pytest.fixture(scope="session")
def pg_template(pg_server: PostgresServer) -> str:
    """Stands in for the migrated template here: these tests are about the
    copy-per-test mechanism, not about the migrations."""
    pg_server.drop_database(SERVERS_TEMPLATE)
    pg_server.create_database(SERVERS_TEMPLATE)
    with psycopg.connect(pg_server.url(SERVERS_TEMPLATE), autocommit=True) as conn:
        conn.execute("CREATE TABLE marks (name text PRIMARY KEY)")
    return SERVERS_TEMPLATE


def _marks(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [row[0] for row in conn.execute("SELECT name FROM marks ORDER BY name")]


def _mark(url: str, name: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO marks VALUES (%s)", (name,))


# -- Redis --------------------------------------------------------------------


def test_redis_client_reconnects_after_kill_and_start_on_same_port(redis_server, redis_url):
    client = redis.Redis.from_url(redis_url, retry_on_error=[])
    try:
        client.set("before", "1")
        port = redis_server.port

        redis_server.kill()
        assert not redis_server.is_running
        with pytest.raises(redis.ConnectionError):
            client.get("before")

        redis_server.start()
        assert redis_server.port == port and redis_server.url == redis_url
        assert client.ping()
        assert client.get("before") is None  # no persistence: a crash forgets
    finally:
        client.close()


def test_redis_url_is_flushed_for_each_test(redis_server, redis_url):
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.dbsize() == 0
        client.set("left-behind", "1")  # the next test's redis_url must not see it
    finally:
        client.close()


def test_redis_url_restarts_a_stopped_server(redis_server, request):
    redis_server.stop()
    redis_server.stop()  # idempotent
    assert not redis_server.is_running
    url = request.getfixturevalue("redis_url")
    client = redis.Redis.from_url(url)
    try:
        assert client.dbsize() == 0
    finally:
        client.close()


# -- PostgreSQL ---------------------------------------------------------------


def test_postgres_new_connection_works_after_crash_and_start(pg_server, make_database):
    url = make_database()
    with psycopg.connect(url) as conn:
        # The server runs with synchronous_commit=off; this commit must survive.
        conn.execute("SET synchronous_commit = on")
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (42)")
    old = psycopg.connect(url)
    try:
        port = pg_server.port

        pg_server.kill()
        assert not pg_server.is_running
        with pytest.raises(psycopg.OperationalError):
            old.execute("SELECT 1")

        pg_server.start()
        assert pg_server.port == port
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT x FROM t").fetchall() == [(42,)]
    finally:
        old.close()


def test_postgres_restart_keeps_data(pg_server, make_database):
    url = make_database()
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE t AS SELECT 1 AS x")
    pg_server.restart()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT x FROM t").fetchone() == (1,)


def test_drop_database_ends_open_sessions(pg_server, make_database):
    url = make_database()
    name = url.rsplit("/", 1)[1]
    conn = psycopg.connect(url)
    try:
        pg_server.drop_database(name)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    finally:
        conn.close()
    with pg_server.connect() as admin:
        assert admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None


def test_postgres_start_failure_quotes_the_server_log():
    with pytest.raises(ServerStartError, match="max_connections"):
        PostgresServer(tempfile.mkdtemp(prefix="conveyor-pg-bad-"), settings={"max_connections": "not-a-number"})


# -- one database per test ----------------------------------------------------

_first_test_db: dict[str, str] = {}


def test_database_url_is_a_copy_of_the_template(database_url, make_database, pg_template, pg_server):
    _mark(database_url, "mine")
    other = make_database(template=pg_template)

    assert _marks(database_url) == ["mine"]
    assert _marks(other) == []
    assert _marks(pg_server.url(pg_template)) == []
    _first_test_db["url"] = database_url


def test_database_url_is_new_for_each_test(database_url, pg_server):
    assert _marks(database_url) == []
    previous = _first_test_db.get("url")
    if previous is None:
        pytest.skip("run with the test before it to check the drop")
    assert previous != database_url
    name = previous.rsplit("/", 1)[1]
    with pg_server.connect() as admin:
        assert admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None

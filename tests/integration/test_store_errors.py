"""A server that goes away reaches callers as conveyor's error, never as psycopg's or redis-py's (issue 12).

Real servers, stopped for real: the session's Postgres shut down under an
App's open pool, the session's Redis killed under the stream buffer, the
limits and the worker registry. Each store call must raise a
:class:`~conveyor.errors.StoreUnavailable` (whose HTTP status is 503), and
an API route must answer 503 with neither a traceback nor the request's
own values in its body.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import psycopg
import pytest
import redis

from conveyor.app import App
from conveyor.brokers.fleet import fleet_store
from conveyor.budgets import Take, budget_store
from conveyor.db import connect
from conveyor.errors import BrokerUnreachable, DatabaseRefused, DatabaseUnavailable, StoreUnavailable
from conveyor.platform import records
from conveyor.platform.limits import limits_for
from conveyor.platform.streams import buffer_for
from conveyor.settings import Settings
from tests.support.platform_support import serve, user_key
from tests.support.servers import PostgresServer, RedisServer

#: A value only the request carries: an answer that contains it echoed the input.
MARKER = "marker-7f3a9c-do-not-echo"


@pytest.fixture
def make_app(clean_env: pytest.MonkeyPatch, redis_url: str, database_url: str) -> Iterator[Callable[..., App]]:
    apps: list[App] = []

    def make(broker: str = "redis") -> App:
        app = App(Settings(broker=broker, redis_url=redis_url, database_url=database_url, redis_retries=1))
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


@pytest.fixture
def postgres_down(pg_server: PostgresServer) -> Iterator[Callable[[], None]]:
    """Call it to shut the session's Postgres down; it is started again after the test (its databases kept)."""
    yield pg_server.stop
    pg_server.start()


@pytest.fixture
def redis_down(redis_server: RedisServer) -> Iterator[Callable[[], None]]:
    """Call it to kill the session's Redis; it is started again after the test."""
    yield redis_server.kill
    redis_server.start()


def _assert_plain_503(answer: httpx.Response, *secrets: str) -> None:
    assert answer.status_code == 503, answer.text
    assert "Traceback" not in answer.text and 'File "' not in answer.text
    # The driver's line (the server's address and port) stays in the log.
    assert answer.json() == {"detail": answer.json()["detail"]} and "127.0.0.1" not in answer.text
    assert answer.json()["detail"].endswith("is unavailable; try again later"), answer.text
    for secret in secrets:
        assert secret not in answer.text


def test_a_store_call_on_a_stopped_postgres_raises_database_unavailable(make_app, postgres_down):
    app = make_app()
    with app.pool.connection() as conn:
        records.create_task(conn, id="t1", user_id="u1")  # the pool is open, its connection live
    postgres_down()
    with pytest.raises(DatabaseUnavailable) as raised:
        with app.pool.connection() as conn:
            records.get_task(conn, "t1")
    assert isinstance(raised.value, StoreUnavailable)
    assert isinstance(raised.value.__cause__, psycopg.Error)  # the chain keeps psycopg's own error for the log


def test_postgres_stores_off_the_pools_with_block_raise_database_unavailable_too(make_app, postgres_down):
    # One App per call: each pool holds one live connection, which the stop breaks (a second call
    # would wait out the pool's timeout for a new one, which ends in DatabaseUnavailable as well).
    for_limits, for_streams = make_app("postgres"), make_app("postgres")
    semaphore, buffer = limits_for(for_limits).semaphore, buffer_for(for_streams)
    with for_limits.pool.connection(), for_streams.pool.connection():
        pass  # both pools open while Postgres runs
    postgres_down()
    with pytest.raises(DatabaseUnavailable):
        semaphore.try_acquire("llm", 2)  # a connection kept out of the pool for the slot's lifetime
    with pytest.raises(DatabaseUnavailable):
        buffer.read("run_1")


def test_a_refused_statement_is_database_refused_and_an_inline_except_still_sees_psycopg(make_app):
    app = make_app()
    with app.pool.connection() as conn:
        conn.execute("CREATE TEMP TABLE once (x text PRIMARY KEY)")
        conn.execute("INSERT INTO once VALUES (%s)", [MARKER])
        with pytest.raises(psycopg.errors.UniqueViolation):  # inside the block: psycopg's error, as before
            conn.execute("INSERT INTO once VALUES (%s)", [MARKER])
    with pytest.raises(DatabaseRefused) as raised:
        with app.pool.connection() as conn:
            conn.execute("CREATE TEMP TABLE twice (x text PRIMARY KEY)")
            conn.execute("INSERT INTO twice VALUES (%s), (%s)", [MARKER, MARKER])
    assert MARKER not in str(raised.value)  # psycopg's DETAIL quotes the row: only its first line is kept


def test_a_connection_of_its_own_translates_at_the_end_of_its_block(database_url, postgres_down):
    with pytest.raises(DatabaseRefused):
        with connect(database_url, autocommit=True) as conn:
            conn.execute("SELECT 1 / 0")
    conn = connect(database_url, autocommit=True)
    postgres_down()
    with pytest.raises(DatabaseUnavailable):
        with conn:
            conn.execute("SELECT 1")
    with pytest.raises(DatabaseUnavailable):
        connect(database_url, connect_timeout=2)


def test_an_api_route_answers_503_when_postgres_is_down(make_app, postgres_down):
    app = make_app()
    headers = user_key(app, "alice")
    with serve(app) as base, httpx.Client(base_url=base, timeout=60) as client:
        postgres_down()
        answer = client.put(f"/api/resources/{MARKER}", json={"title": MARKER, "body": MARKER}, headers=headers)
    _assert_plain_503(answer, MARKER, headers["Authorization"].removeprefix("Bearer "))


def test_redis_stores_raise_store_unavailable_when_redis_is_killed(make_app, redis_down):
    app = make_app()
    buffer, limits, fleet = buffer_for(app), limits_for(app), fleet_store(app)
    assert buffer.append("run_1", 1, "hello")  # all three work while Redis runs
    assert budget_store(app).take([Take("provider-requests", 10, 60, 1)]) == [0.0]
    fleet.workers()
    redis_down()
    calls: list[Callable[[], object]] = [
        lambda: buffer.append("run_1", 2, "world"),
        lambda: buffer.read("run_1"),
        lambda: budget_store(app).take([Take("provider-requests", 10, 60, 1)]),
        lambda: limits.semaphore.try_acquire("llm", 2),
        fleet.workers,
        lambda: fleet.attempts("job_1"),
    ]
    for call in calls:
        with pytest.raises(StoreUnavailable) as raised:
            call()
        assert isinstance(raised.value, BrokerUnreachable)
        assert isinstance(raised.value.__cause__, redis.RedisError)


def test_an_api_route_answers_503_when_redis_is_down(make_app, redis_down):
    app = make_app()
    headers = user_key(app, "alice")
    with serve(app) as base, httpx.Client(base_url=base, timeout=60) as client:
        redis_down()
        answer = client.put(f"/api/resources/{MARKER}", json={"title": MARKER, "body": MARKER}, headers=headers)
    _assert_plain_503(answer, MARKER)

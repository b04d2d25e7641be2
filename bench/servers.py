"""The benchmark's own Redis and Postgres, private to one run (the test suite's servers, reused).

Nothing here touches the machine's Redis or Postgres: both servers start
from the machine's binaries on free loopback ports, with their files in
a temporary directory removed at the end.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path

import redis

from tests.support.servers import PostgresServer, RedisServer

from . import procstat

#: By default our Postgres runs with the test suite's settings: fsync and
#: synchronous commit off, the same for every Postgres peer. A durable server
#: (``--pg-durable``) makes every commit wait for the disk, as production does:
#: brokers that commit once per job fall behind those that batch.
DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}


class Servers:
    """A private Redis and Postgres; ``fresh_database`` gives each measurement its own database."""

    def __init__(
        self, redis_url: str, pg: PostgresServer, run_dir: Path, owned: tuple = (), pg_durable: bool = False
    ) -> None:
        self.redis_url = redis_url
        self.pg = pg
        self.pg_durable = pg_durable
        self.run_dir = run_dir
        self._owned = owned
        self._made: list[str] = []
        self._numbers = itertools.count(1)

    @classmethod
    def start(cls, pg_durable: bool = False) -> "Servers":
        """Start both servers (a few seconds: initdb)."""
        run_dir = Path(tempfile.mkdtemp(prefix="conveyor-bench-"))
        redis_server = RedisServer(tempfile.mkdtemp(prefix="conveyor-bench-redis-"))
        try:
            pg = PostgresServer(tempfile.mkdtemp(prefix="conveyor-bench-pg-"), settings=DURABLE if pg_durable else None)
        except BaseException:
            redis_server.close()
            raise
        return cls(redis_server.url, pg, run_dir, owned=(redis_server, pg), pg_durable=pg_durable)

    @property
    def admin_url(self) -> str:
        """The ``postgres`` database: for settings that need a URL which is never used."""
        return self.pg.url()

    def flush_redis(self) -> None:
        client = redis.Redis.from_url(self.redis_url)
        try:
            client.flushall()
        finally:
            client.close()

    def fresh_database(self, prefix: str) -> str:
        """A new empty database; the previous ones are dropped to keep the cluster small."""
        self.drop_databases()
        name = f"bench_{prefix}_{next(self._numbers)}"
        self.pg.create_database(name)
        self._made.append(name)
        return self.pg.url(name)

    def drop_databases(self) -> None:
        for name in self._made:
            self.pg.drop_database(name)
        self._made.clear()

    def cpu_seconds(self) -> float:
        """CPU the servers have used so far: Redis, and Postgres with every backend, ended ones included."""
        return sum(procstat.tree_cpu_seconds(server.pid) for server in self._owned if server.pid)

    def close(self) -> None:
        for server in self._owned:
            server.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> "Servers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

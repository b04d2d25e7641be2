"""Bare Dramatiq: its own RedisBroker, and dramatiq-postgres, with Dramatiq's default middleware.

The worker is what the ``dramatiq`` command runs: ``process_boot``, then a
:class:`dramatiq.Worker` with the harness's thread count. Logging stays at
Python's default (WARNING): Dramatiq writes no line per message anyway.
"""

from __future__ import annotations

from .base import Peer, Producer, block_forever

QUEUE = "bench"
#: The dramatiq command's default: idle consumers wake once a second.
WORKER_TIMEOUT_MS = 1000


def declare(broker):
    """The no-op actor on ``broker``: its body is the probe itself."""
    import dramatiq

    from bench import probe

    return dramatiq.Actor(probe.hit, broker=broker, actor_name="noop", queue_name=QUEUE, priority=0, options={})


class DramatiqProducer(Producer):
    def __init__(self, broker) -> None:
        self.broker = broker
        self.actor = declare(broker)

    def send(self, payload: dict) -> None:
        self.actor.send(payload)

    def close(self) -> None:
        self.broker.close()


def serve_dramatiq(broker, threads: int, ready, go) -> None:
    from dramatiq import Worker

    declare(broker)
    ready.set()
    go.wait()
    broker.emit_after("process_boot")
    Worker(broker, worker_threads=threads, worker_timeout=WORKER_TIMEOUT_MS).start()
    block_forever()


class DramatiqRedis(Peer):
    name = "dramatiq-redis"
    label = "bare Dramatiq (Redis)"
    backend = "redis"
    distributions = ("dramatiq", "redis")

    def setup(self, servers, tag: str) -> dict:
        servers.flush_redis()
        return {"redis_url": servers.redis_url}

    def _broker(self, env: dict):
        from dramatiq.brokers.redis import RedisBroker

        return RedisBroker(url=env["redis_url"], namespace="bench-dramatiq")

    def producer(self, env: dict) -> Producer:
        return DramatiqProducer(self._broker(env))

    def serve(self, env: dict, threads: int, ready, go) -> None:
        serve_dramatiq(self._broker(env), threads, ready, go)

    def describe(self) -> str:
        return "dramatiq.brokers.redis.RedisBroker, Dramatiq's default middleware, dramatiq.Worker"


class DramatiqPostgres(Peer):
    name = "dramatiq-postgres"
    label = "dramatiq-postgres"
    backend = "postgres"
    distributions = ("dramatiq-postgres", "dramatiq", "psycopg")

    def unavailable(self) -> str | None:
        import importlib.util

        if importlib.util.find_spec("dramatiq_postgres") is None:
            return "not measured: dramatiq-postgres is not installed (pip install -e '.[bench]')"
        return None

    def setup(self, servers, tag: str) -> dict:
        import psycopg
        from dramatiq_postgres.schema import init

        url = servers.fresh_database("dramatiq")
        with psycopg.connect(url) as conn, conn.cursor() as curs:
            init(curs)
        return {"database_url": url}

    def _broker(self, env: dict):
        from dramatiq_postgres import PostgresBroker

        # No results backend: conveyor keeps none either.
        return PostgresBroker(url=env["database_url"], results=False)

    def producer(self, env: dict) -> Producer:
        return DramatiqProducer(self._broker(env))

    def serve(self, env: dict, threads: int, ready, go) -> None:
        serve_dramatiq(self._broker(env), threads, ready, go)

    def describe(self) -> str:
        return "dramatiq_postgres.PostgresBroker (LISTEN/NOTIFY on), no results, Dramatiq's default middleware"

"""Celery on the same Redis: thread pool, the harness's concurrency, Celery's defaults otherwise.

Defaults kept on purpose (they are what users compare against): early
acks, prefetch multiplier 4, worker log level WARNING (its default, which
writes no line per task). Results are ignored, as conveyor stores none.
Gossip, mingle and heartbeat are off: they only slow start-up here.
"""

from __future__ import annotations

from .base import Peer, Producer

QUEUE = "bench"


def make_app(redis_url: str):
    from celery import Celery

    from bench import probe

    app = Celery("bench", broker=redis_url, set_as_current=False)
    app.conf.update(
        task_ignore_result=True,
        task_default_queue=QUEUE,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    task = app.task(name="noop")(probe.hit)
    return app, task


class CeleryProducer(Producer):
    def __init__(self, redis_url: str) -> None:
        self.app, self.task = make_app(redis_url)

    def send(self, payload: dict) -> None:
        self.task.apply_async((payload,))

    def close(self) -> None:
        self.app.close()


class CeleryRedis(Peer):
    name = "celery-redis"
    label = "Celery (Redis, threads pool)"
    backend = "redis"
    distributions = ("celery", "kombu", "redis")

    def setup(self, servers, tag: str) -> dict:
        servers.flush_redis()
        return {"redis_url": servers.redis_url}

    def producer(self, env: dict) -> Producer:
        return CeleryProducer(env["redis_url"])

    def serve(self, env: dict, threads: int, ready, go) -> None:
        import os

        from celery.signals import worker_init

        app, _ = make_app(env["redis_url"])

        # Hold the worker before its consumer starts, like the other peers' go.
        def hold(**_):
            ready.set()
            go.wait()

        worker_init.connect(hold, weak=False)
        app.worker_main(
            [
                "worker",
                "--pool=threads",
                f"--concurrency={threads}",
                "-Q",
                QUEUE,
                "--loglevel=WARNING",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-n",
                f"bench{os.getpid()}@localhost",
            ]
        )

    def describe(self) -> str:
        return "Celery worker --pool=threads, defaults (early ack, prefetch x4), results ignored"

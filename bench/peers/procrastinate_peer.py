"""procrastinate on the same Postgres: its worker with the harness's concurrency.

The task is an ``async def``, procrastinate's native and fastest form (a
sync task would run through a thread hop): the peer gets its best case.
"""

from __future__ import annotations

from .base import Peer, Producer

QUEUE = "bench"


def make_app(url: str):
    import procrastinate

    from bench import probe

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop", queue=QUEUE)
    async def noop(i: int, t: float = 0.0) -> None:
        probe.hit({"i": i, "t": t})

    return app, noop


class ProcrastinateProducer(Producer):
    bulk_method = "Task.batch_defer, 500 per call"

    def __init__(self, url: str) -> None:
        self.app, self.task = make_app(url)
        self.app.open()

    def enqueue_bulk(self, payloads: list[dict]) -> None:
        for start in range(0, len(payloads), 500):
            self.task.batch_defer(*payloads[start : start + 500])

    def send(self, payload: dict) -> None:
        self.task.defer(**payload)

    def close(self) -> None:
        self.app.close()


class ProcrastinatePostgres(Peer):
    name = "procrastinate"
    label = "procrastinate"
    backend = "postgres"
    distributions = ("procrastinate", "psycopg")

    def unavailable(self) -> str | None:
        import importlib.util

        if importlib.util.find_spec("procrastinate") is None:
            return "not measured: procrastinate is not installed (pip install -e '.[bench]')"
        return None

    def setup(self, servers, tag: str) -> dict:
        url = servers.fresh_database("procrastinate")
        app, _ = make_app(url)
        with app.open():
            app.schema_manager.apply_schema()
        return {"database_url": url}

    def producer(self, env: dict) -> Producer:
        return ProcrastinateProducer(env["database_url"])

    def serve(self, env: dict, threads: int, ready, go) -> None:
        app, _ = make_app(env["database_url"])
        ready.set()
        go.wait()
        app.run_worker(queues=[QUEUE], concurrency=threads, wait=True)

    def describe(self) -> str:
        return "procrastinate worker, async no-op task, LISTEN/NOTIFY on, jobs kept (delete_jobs=never, its default)"

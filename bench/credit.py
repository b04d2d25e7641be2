"""credit.consume end to end against the SQL it runs, from the same number of threads.

Three ways to apply the same ``ops`` charges (users round-robin over
:data:`USERS` accounts, each charge a new reference), each on a fresh,
migrated database and from ``processes`` x ``threads`` threads:

``conveyor``
    credit.consume jobs enqueued through the JobQueue (with their
    idempotency keys) on conveyor's Redis broker, run by conveyor's
    ProcessWorker on the ``critical`` queue: the production path.
``function``
    ``ledger.credits.consume`` called directly on ``app.pool`` connections,
    as the processor calls it, without a broker: where the broker's share
    of the cost ends.
``sql``
    the ``apply_entry`` statement ``credits.consume`` runs (insert the entry
    first, move the balance only if it went in), executed with
    precomputed parameters on one connection per thread.

Each is timed from the go signal (workers booted, pools open) until every
charge is applied; afterwards the ledger is verified.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from decimal import Decimal

from .peers.base import Peer, block_forever
from .peers.conveyor_peer import BULK_CHUNK, ConveyorProducer, conveyor_settings, serve_conveyor
from .probe import Probe
from .runner import POLL_SECONDS, MeasurementFailed, Workers, _redirect_output, running

#: Accounts the charges are spread over: enough that threads rarely wait on one balance row.
USERS = 100
#: The price every variant charges with (conveyor's default).
PRICE_PER_1K = Decimal("0.002")
QUEUE = "critical"

KINDS = ("conveyor", "function", "sql")


@dataclass
class CreditRun:
    ops: int
    seconds: float
    verified: bool
    worker_cpu_s: float  # the client processes (conveyor workers, or the threads calling the function / SQL)
    server_cpu_s: float  # Redis and Postgres with its backends

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0


def charge(k: int, tag: str) -> dict:
    """The k-th charge's payload (a CreditConsume)."""
    return {
        "user_id": f"u{k % USERS}",
        "task_id": f"task-{tag}",
        "message_id": f"m{k}",
        "total_tokens": 1000 + k % 5000,
    }


class _CreditWorkers(Peer):
    """Stand-in peer so :class:`~bench.runner.Workers` can name the processes."""

    backend = "postgres"

    def __init__(self, kind: str) -> None:
        self.name = f"credit-{kind}"


def credit_child(kind: str, env: dict, threads: int, probe: Probe, slot: int, ready, go, log_path: str) -> None:
    """Entry point of one process of the ``function`` or ``sql`` variant (or conveyor's worker)."""
    _redirect_output(log_path)
    if kind == "conveyor":
        serve_conveyor(env, QUEUE, threads, ready, go, warm_pool=True)
        return
    from . import probe as probe_module

    probe_module.attach(probe, slot)
    mine = [k for k in range(env["ops"]) if k % env["processes"] == slot]
    shares = [mine[t::threads] for t in range(threads)]
    run = _function_runner(env, threads) if kind == "function" else _sql_runner(env, threads)
    workers = [threading.Thread(target=run, args=(t, share, go), daemon=True) for t, share in enumerate(shares)]
    for worker in workers:
        worker.start()
    run.ready.wait()
    ready.set()
    block_forever()


class _Barrier:
    """Counts threads that have their connection; ``ready`` once all have."""

    def __init__(self, parties: int) -> None:
        self.ready = threading.Event()
        self._left = parties
        self._lock = threading.Lock()

    def arrive(self) -> None:
        with self._lock:
            self._left -= 1
            if self._left == 0:
                self.ready.set()


def _function_runner(env: dict, threads: int):
    from conveyor.app import App
    from conveyor.ledger import credits

    from . import probe

    app = App(conveyor_settings(env))
    barrier = _Barrier(threads)

    def run(_thread: int, share: list[int], go) -> None:
        pool = app.pool
        with pool.connection():  # one connection per thread is open before the clock starts
            barrier.arrive()
            go.wait()
        for k in share:
            c = charge(k, env["tag"])
            with pool.connection() as conn:
                credits.consume(
                    conn,
                    user_id=c["user_id"],
                    task_id=c["task_id"],
                    message_id=c["message_id"],
                    total_tokens=c["total_tokens"],
                    price_per_1k=PRICE_PER_1K,
                )
            probe.hit({"i": k})

    run.ready = barrier.ready
    return run


def _sql_runner(env: dict, threads: int):
    import psycopg

    from conveyor.ledger import credits

    from . import probe

    barrier = _Barrier(threads)

    def run(_thread: int, share: list[int], go) -> None:
        params = []
        for k in share:
            c = charge(k, env["tag"])
            params.append(
                (
                    k,
                    {
                        "reference_id": credits.consume_reference(c["task_id"], c["message_id"]),
                        "user_id": c["user_id"],
                        "kind": "consume",
                        "amount": -credits.cost(c["total_tokens"], PRICE_PER_1K),
                        "tokens": c["total_tokens"],
                        "task_id": c["task_id"],
                        "message_id": c["message_id"],
                    },
                )
            )
        statement = credits.QUERIES["apply_entry"]
        with psycopg.connect(env["database_url"], autocommit=True) as conn:
            barrier.arrive()
            go.wait()
            for k, values in params:
                conn.execute(statement, values).fetchone()
                probe.hit({"i": k})

    run.ready = barrier.ready
    return run


def _prepare_ledger(servers, tag: str) -> str:
    from conveyor.db import connect
    from conveyor.ledger import credits
    from conveyor.schema.migrate import migrate

    url = servers.fresh_database("credit")
    migrate(url)
    with connect(url, autocommit=True) as conn:
        for u in range(USERS):
            credits.top_up(conn, user_id=f"u{u}", amount=Decimal(1_000_000), reference=f"seed-{tag}-{u}")
    return url


def _verify(url: str, ops: int) -> bool:
    """Every charge applied once and every balance equal to its entries."""
    from conveyor.db import connect
    from conveyor.ledger import credits

    with connect(url, autocommit=True) as conn:
        return credits.totals(conn).entries == ops + USERS and not credits.verify(conn)


def measure_credit(kind: str, servers, *, ops: int, processes: int, threads: int, tag: str) -> CreditRun:
    """Apply ``ops`` charges the ``kind`` way; see the module docstring."""
    url = _prepare_ledger(servers, tag)
    env = {
        "broker": "redis",
        "redis_url": servers.redis_url,
        "database_url": url,
        "run_dir": str(servers.run_dir),
        "tag": tag,
        "ops": ops,
        "processes": processes,
    }
    probe = Probe.create(processes)
    progress = probe.total
    producer = None
    if kind == "conveyor":
        servers.flush_redis()
        producer = ConveyorProducer(env)
        requests = [_credit_request(k, tag) for k in range(ops)]
        for start in range(0, ops, BULK_CHUNK):
            producer.app.jobs.enqueue_many(requests[start : start + BULK_CHUNK])
        broker = producer.app.broker

        def progress() -> int:
            return broker.queue_counts(QUEUE).completed_total

    workers = Workers(
        _CreditWorkers(kind), env, processes, threads, probe, servers.run_dir, target=credit_child, target_name=kind
    )
    try:
        with running(workers):
            cpu_before, server_before = workers.cpu_seconds(), servers.cpu_seconds()
            started = time.perf_counter()
            workers.release()
            deadline = started + 60 + ops / 20
            while progress() < ops:
                if time.perf_counter() > deadline:
                    raise MeasurementFailed(
                        f"credit/{kind}: {progress()} of {ops} charges in time{workers._log_tail()}"
                    )
                workers.check_alive()
                time.sleep(POLL_SECONDS)
            seconds = time.perf_counter() - started
            cpu = workers.cpu_seconds() - cpu_before
            server_cpu = servers.cpu_seconds() - server_before
    finally:
        if producer is not None:
            producer.close()
    return CreditRun(ops, seconds, _verify(url, ops), cpu, server_cpu)


def _credit_request(k: int, tag: str):
    from conveyor.platform.payloads import CreditConsume
    from conveyor.tasks.jobqueue import JobRequest

    payload = CreditConsume(**charge(k, tag))
    return JobRequest("credit.consume", payload, key=payload.idempotency_key())

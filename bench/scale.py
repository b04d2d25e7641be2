"""Cost as the work grows: drain rate against backlog, kept history, live dedup keys, and worker processes.

    .venv/bin/python -m bench.scale [--quick] [--backlogs 1000,100000,1000000] [--history 10000000]

Real ``conveyor`` worker processes (bench/peers/conveyor_peer.py: the full
middleware, JSON event logs to a file), on private Redis and Postgres
(bench/servers.py; Postgres durable by default: fsync and synchronous
commit on, as the issue measures it).

- **Backlog**: ``B + warmup + window`` jobs are enqueued (``enqueue_many``
  in chunks of 500, each job with a dedup key, as the main bench does),
  then 2 processes x 8 threads drain. The rate is that of the ``window``
  jobs started after the first ``warmup`` ones, from the jobs' own stamps
  (bench/probe.py): at least ``B`` jobs wait throughout the window, so the
  figure is the cost per job at that backlog, not the backlog's length.
- **History** (Postgres): the same with ``--history`` finished jobs kept
  (status done, with their attempt rows), written by one INSERT ...
  generate_series with the tables' indexes dropped and rebuilt, then
  VACUUM ANALYZE, as a table in steady state would be.
- **Dedup keys**: the same with ``--dedup-keys`` live keys held by jobs
  delayed an hour on the same queue.
- **Processes**: ``--curve-jobs`` jobs drained by 1, 2, 4 processes x 8
  threads (bench/runner.py's throughput measure), rounds interleaved.

For Postgres each cell also gets EXPLAIN ANALYZE of the claim statement
(rolled back) just before the drain, and with history the two prune
statements, so a rate that falls can be read against its plan.
Writes bench/RESULTS-scale.md and bench/scale.png (``--quick``: into the run's temp dir).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import redis

from . import runner
from .peers import get_peer
from .probe import Probe
from .servers import Servers

HERE = Path(__file__).resolve().parent

FULL = {
    "backlogs": [1_000, 100_000, 1_000_000],
    "window": 5_000,
    "warmup": 500,
    "history": 10_000_000,
    "dedup_keys": 10_000,
    "curve_jobs": 20_000,
    "rounds": 3,
}
QUICK = {
    "backlogs": [1_000, 20_000],
    "window": 1_500,
    "warmup": 200,
    "history": 200_000,
    "dedup_keys": 2_000,
    "curve_jobs": 3_000,
    "rounds": 1,
}

PEERS = {"redis": "conveyor-redis", "postgres": "conveyor-postgres"}

#: Jobs per enqueue_many call when building a backlog (the main bench's chunk).
CHUNK = 500


@dataclass
class Window:
    rate: float  # jobs/s over the window
    worker_cpu_ms: float  # per job, all worker processes
    server_cpu_ms: float  # per job, Redis or Postgres
    enqueue_rate: float
    notes: dict = field(default_factory=dict)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def parse_ints(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


# -- building the state to drain in ----------------------------------------------------------


def enqueue(env: dict, first: int, count: int, *, prefix: str, delay: float | None = None) -> float:
    """Enqueue ``count`` bench.noop jobs with dedup keys (indexes from ``first``); seconds taken."""
    from conveyor.app import App
    from conveyor.tasks.jobqueue import JobRequest

    from .peers.conveyor_peer import conveyor_settings

    app = App(conveyor_settings(env))
    try:
        started = time.perf_counter()
        for start in range(first, first + count, CHUNK):
            stop = min(start + CHUNK, first + count)
            app.jobs.enqueue_many(
                [
                    JobRequest("bench.noop", {"i": i, "t": 0.0}, key=f"{prefix}:{env['tag']}:{i}", delay=delay)
                    for i in range(start, stop)
                ]
            )
        return time.perf_counter() - started
    finally:
        app.close()


def add_history(url: str, rows: int) -> dict:
    """``rows`` finished jobs (done, a day old, each with its attempt row), shaped from one real job."""
    # One real job, enqueued through the broker, is the template of every row's message.
    notes: dict = {}
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        template = conn.execute("SELECT id FROM conveyor_jobs LIMIT 1").fetchone()
        if template is None:
            raise RuntimeError("add_history needs one job to copy")
        # Secondary indexes are rebuilt after the insert (a sort each, not 10 M random inserts);
        # the primary keys stay (a foreign key hangs on the jobs' one), fed ids in ascending order.
        indexes = conn.execute(
            "SELECT i.indexname, i.indexdef FROM pg_indexes i "
            "WHERE i.tablename IN ('conveyor_jobs', 'conveyor_job_attempts') "
            "AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)"
        ).fetchall()
        for name, _ in indexes:
            conn.execute(f"DROP INDEX {name}")
        # Replica role: no per-row rank trigger, no enqueue counting (these jobs were counted long ago).
        conn.execute("SET session_replication_role = replica")
        conn.execute(
            """
            INSERT INTO conveyor_jobs (id, queue, job, status, priority, attempt, delivery, started_delivery,
                                       job_key, key_expires_at, message, created_at, available_at, rank_at,
                                       picked_at, started_at, completed_at)
            SELECT 'hist-' || lpad(g::text, 9, '0'), t.queue, t.job, 'done', 0, 1, 1, 1,
                   'hist:' || g, ts + interval '1 hour',
                   jsonb_set(t.message, '{message_id}', to_jsonb('hist-' || lpad(g::text, 9, '0'))),
                   ts, ts, ts, ts, ts, ts + interval '5 ms'
            FROM (SELECT queue, job, message FROM conveyor_jobs WHERE id = %(id)s) t,
                 generate_series(1, %(rows)s) g,
                 LATERAL (SELECT now() - interval '1 day' - g * interval '1 ms' AS ts) s
            """,
            {"id": template[0], "rows": rows},
        )
        conn.execute(
            """
            INSERT INTO conveyor_job_attempts (job_id, token, attempt, worker, started_at, ended_at, outcome)
            SELECT 'hist-' || lpad(g::text, 9, '0'), 'hist-' || lpad(g::text, 9, '0') || ':1', 1, 'bench-history',
                   now() - interval '1 day' - g * interval '1 ms',
                   now() - interval '1 day' - g * interval '1 ms' + interval '5 ms', 'done'
            FROM generate_series(1, %(rows)s) g
            """,
            {"rows": rows},
        )
        conn.execute("SET session_replication_role = origin")
        notes["insert_s"] = time.perf_counter() - started
        built = time.perf_counter()
        for _, definition in indexes:
            conn.execute(definition)
        notes["index_s"] = time.perf_counter() - built
        conn.execute("VACUUM ANALYZE conveyor_jobs")
        conn.execute("VACUUM ANALYZE conveyor_job_attempts")
        # Gigabytes written just now would otherwise be flushed by the checkpointer during the
        # drain, and counted as the drain's server CPU.
        conn.execute("CHECKPOINT")
        notes["size"] = conn.execute(
            "SELECT pg_size_pretty(pg_total_relation_size('conveyor_jobs') "
            "+ pg_total_relation_size('conveyor_job_attempts'))"
        ).fetchone()[0]
    notes["total_s"] = time.perf_counter() - started
    return notes


def explain(url: str, statement: str, params: dict) -> str:
    """EXPLAIN ANALYZE of one statement, rolled back: the plan's scan lines and the execution time."""
    with psycopg.connect(url) as conn:
        try:
            rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, params).fetchall()
        finally:
            conn.rollback()
    lines = [r[0] for r in rows]
    keep = [line.strip() for line in lines if "Scan" in line or "Execution Time" in line]
    return " | ".join(keep)


def pg_statements() -> dict:
    from conveyor.brokers.fleet.postgres_store import QUERIES as FLEET
    from conveyor.brokers.postgres.jobs import QUERIES

    return {"claim": QUERIES["claim"], "prune": QUERIES["prune"], "prune_attempts": FLEET["prune_attempts"]}


# -- measuring --------------------------------------------------------------------------------


def drain_window(servers: Servers, env: dict, *, warmup: int, window: int, processes: int, threads: int) -> tuple:
    """Release ``processes`` x ``threads`` workers on what is enqueued; time jobs warmup..warmup+window."""
    peer = get_peer(PEERS[env["broker"]])
    probe = Probe.create(processes)
    with runner.running(runner.Workers(peer, env, processes, threads, probe, servers.run_dir)) as workers:
        workers.release()
        runner.wait_for_jobs(probe, warmup, workers, runner.BOOT_TIMEOUT + warmup / 20)
        t0, n0 = time.time(), probe.total()
        cpu0, server0 = workers.cpu_seconds(), servers.cpu_seconds()
        deadline = time.monotonic() + runner.drain_timeout(window)
        while (n1 := probe.total()) < warmup + window:
            if time.monotonic() > deadline:
                raise runner.MeasurementFailed(f"only {n1 - n0} of {window} window jobs ran")
            workers.check_alive()
            time.sleep(0.001)
        t1 = time.time()
        jobs = n1 - n0
        cpu = workers.cpu_seconds() - cpu0
        server = servers.cpu_seconds() - server0
    return jobs / (t1 - t0), cpu * 1000 / jobs, server * 1000 / jobs


def fresh_env(servers: Servers, broker: str, tag: str) -> dict:
    # A million jobs take Redis seconds to flush, past the client's usual socket timeout.
    client = redis.Redis.from_url(servers.redis_url, socket_timeout=None)
    try:
        client.flushall()
    finally:
        client.close()
    return get_peer(PEERS[broker]).setup(servers, tag)


def measure_cell(
    servers: Servers,
    broker: str,
    *,
    backlog: int,
    warmup: int,
    window: int,
    history: int = 0,
    dedup_keys: int = 0,
    processes: int = 2,
    threads: int = 8,
    tag: str,
) -> Window:
    env = fresh_env(servers, broker, tag)
    notes: dict = {}
    if dedup_keys:  # live keys held by jobs delayed an hour, on the same queue
        enqueue(env, 10_000_000, dedup_keys, prefix="held", delay=3600.0)
    if history:
        enqueue(env, 20_000_000, 1, prefix="template", delay=3600.0)
        notes["history"] = add_history(env["database_url"], history)
        log(f"  history: {history:,} rows {notes['history']}")
    total = backlog + warmup + window
    seconds = enqueue(env, 0, total, prefix="bench")
    if broker == "postgres":
        url = env["database_url"]
        with psycopg.connect(url, autocommit=True) as conn:
            # A backlog built over time has been vacuumed and checkpointed along the way; one
            # bulk-loaded a second ago has not, and autovacuum or the checkpointer would run in the window.
            conn.execute("VACUUM ANALYZE conveyor_jobs")
            conn.execute("CHECKPOINT")
        statements = pg_statements()
        notes["claim_plan"] = explain(url, statements["claim"], {"queue": "agent", "limit": 8, "worker": "explain"})
        if history:
            week = 7 * 24 * 3600.0
            notes["prune_plan"] = explain(url, statements["prune"], {"retention": week, "limit": 1000})
            notes["prune_attempts_plan"] = explain(
                url, statements["prune_attempts"], {"retention": week, "limit": 1000}
            )
    rate, worker_ms, server_ms = drain_window(
        servers, env, warmup=warmup, window=window, processes=processes, threads=threads
    )
    return Window(rate, worker_ms, server_ms, total / seconds, notes)


# -- the report -------------------------------------------------------------------------------


def spread(values: list[float]) -> str:
    if not values:
        return "—"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:,.0f}"
    return f"{med:,.0f} ({min(values):,.0f}–{max(values):,.0f})"


def write_report(out: Path, plot: Path, args, cells: dict, curve: dict, loads: list[str]) -> None:
    lines = [
        "# Cost as the work grows",
        "",
        f"Written by `python -m bench.scale{' --quick' if args.quick else ''}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{platform.machine()} with {os.cpu_count()} cores; Postgres {'durable (fsync, synchronous_commit on)' if args.pg_durable else 'with the test settings (fsync off)'}.",
        f"Load (`uptime`) while measuring: {'; '.join(loads)}.",
        "",
        "## Drain rate against backlog, history and dedup keys",
        "",
        f"`conveyor` workers, {args.processes} processes x {args.threads} threads, full middleware. "
        f"Each cell: jobs/s over {args.window:,} jobs started after the first {args.warmup:,}, with at least "
        f"the backlog still waiting; median (range) of {args.rounds} round(s), rounds interleaved. "
        "CPU is ms per job, median.",
        "",
        "| broker | state | jobs/s | ÷ smallest | worker CPU ms/job | server CPU ms/job | enqueue_many jobs/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for broker in args.brokers:
        base = None
        for label, results in cells.get(broker, {}).items():
            rates = [w.rate for w in results]
            med = statistics.median(rates) if rates else float("nan")
            if base is None:
                base = med
            lines.append(
                f"| {broker} | {label} | {spread(rates)} | {med / base:.2f}× | "
                f"{statistics.median(w.worker_cpu_ms for w in results):.2f} | "
                f"{statistics.median(w.server_cpu_ms for w in results):.2f} | "
                f"{statistics.median(w.enqueue_rate for w in results):,.0f} |"
            )
    plans = [
        (broker, label, w.notes)
        for broker in args.brokers
        for label, results in cells.get(broker, {}).items()
        for w in results[:1]
        if w.notes
    ]
    if plans:
        lines += ["", "### Postgres plans (first round; EXPLAIN ANALYZE, rolled back, just before the drain)", ""]
        for broker, label, notes in plans:
            for key in ("claim_plan", "prune_plan", "prune_attempts_plan"):
                if key in notes:
                    lines.append(f"- {label}, `{key.removesuffix('_plan')}`: {notes[key]}")
            if "history" in notes:
                lines.append(f"- {label}, history written: {notes['history']}")
    lines += [
        "",
        "## Worker processes (the scaling curve)",
        "",
        f"{args.curve_jobs:,} jobs enqueued first, drained by N processes x {args.threads} threads; "
        f"jobs/s from the first job's start to the last's; median (range) of {args.rounds} round(s).",
        "",
        "| broker | processes | jobs/s | × 1 process | worker CPU ms/job | server CPU ms/job | CPU-bound ceiling, jobs/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for broker in args.brokers:
        one = None
        for processes, results in sorted(curve.get(broker, {}).items()):
            rates = [t.rate for t in results]
            med = statistics.median(rates)
            one = one or med
            worker_ms = statistics.median(t.worker_cpu_s * 1000 / t.jobs for t in results)
            server_ms = statistics.median(t.server_cpu_s * 1000 / t.jobs for t in results)
            lines.append(
                f"| {broker} | {processes} | {spread(rates)} | {med / one:.2f}× | {worker_ms:.2f} | {server_ms:.2f} | "
                f"{(os.cpu_count() or 1) * 1000 / (worker_ms + server_ms):,.0f} |"
            )
    lines += [
        "",
        f"CPU-bound ceiling: {os.cpu_count()} cores ÷ (worker + server CPU per job), what the machine could "
        "drain were nothing else running (the other benchmarks sharing it are not counted).",
        "",
        f"![drain rate against worker processes and backlog]({plot.name})",
        "",
    ]
    out.write_text("\n".join(lines))


def draw(plot: Path, args, cells: dict, curve: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for broker in args.brokers:
        points = sorted(curve.get(broker, {}).items())
        if points:
            xs = [p for p, _ in points]
            meds = [statistics.median(t.rate for t in r) for _, r in points]
            lows = [m - min(t.rate for t in r) for m, (_, r) in zip(meds, points)]
            highs = [max(t.rate for t in r) - m for m, (_, r) in zip(meds, points)]
            left.errorbar(xs, meds, yerr=[lows, highs], marker="o", capsize=4, label=broker)
        backlog = [(b, cells[broker].get(f"backlog {b:,}")) for b in args.backlogs if broker in cells]
        backlog = [(b, r) for b, r in backlog if r]
        if backlog:
            right.plot(
                [b for b, _ in backlog],
                [statistics.median(w.rate for w in r) for _, r in backlog],
                marker="o",
                label=broker,
            )
    left.set(xlabel=f"worker processes (x {args.threads} threads)", ylabel="jobs/s", title=f"{os.cpu_count()} cores")
    left.set_xticks([p for p in args.curve_processes])
    left.set_ylim(bottom=0)
    if left.get_legend_handles_labels()[0]:
        left.legend()
    right.set(xscale="log", xlabel="jobs waiting", ylabel="jobs/s", title="drain rate against backlog")
    right.set_ylim(bottom=0)
    if right.get_legend_handles_labels()[0]:
        right.legend()
    fig.tight_layout()
    fig.savefig(plot, dpi=110)
    plt.close(fig)


# -- the run ----------------------------------------------------------------------------------


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a ~2 minute smoke run: small backlogs, one round")
    p.add_argument("--brokers", default="redis,postgres")
    p.add_argument("--backlogs", help=f"jobs waiting (default {','.join(map(str, FULL['backlogs']))})")
    p.add_argument("--window", type=int, help=f"timed jobs per cell (default {FULL['window']:,})")
    p.add_argument("--warmup", type=int, help=f"jobs before the window (default {FULL['warmup']})")
    p.add_argument("--history", type=int, help=f"finished jobs kept, Postgres; 0: skip (default {FULL['history']:,})")
    p.add_argument("--dedup-keys", type=int, help=f"live dedup keys; 0: skip (default {FULL['dedup_keys']:,})")
    p.add_argument(
        "--curve-jobs", type=int, help=f"jobs per process-curve drain; 0: skip (default {FULL['curve_jobs']:,})"
    )
    p.add_argument("--curve-processes", default="1,2,4")
    p.add_argument("--rounds", type=int, help=f"rounds, interleaved (default {FULL['rounds']})")
    p.add_argument(
        "--big-rounds", type=int, default=1, help="rounds for backlogs over 100,000 and the history (default 1)"
    )
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--no-pg-durable", dest="pg_durable", action="store_false")
    p.add_argument("--output", type=Path, help="report path (default bench/RESULTS-scale.md)")
    args = p.parse_args(argv)
    preset = QUICK if args.quick else FULL
    args.backlogs = parse_ints(args.backlogs) if args.backlogs else preset["backlogs"]
    for name in ("window", "warmup", "history", "dedup_keys", "curve_jobs", "rounds"):
        if getattr(args, name) is None:
            setattr(args, name, preset[name])
    args.brokers = [b for b in args.brokers.split(",") if b]
    args.curve_processes = parse_ints(args.curve_processes)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    loads: list[str] = []

    def load() -> None:
        loads.append(f"{time.strftime('%H:%M')} {os.getloadavg()[0]:.2f}/{os.getloadavg()[1]:.2f}")

    cells: dict = {b: {} for b in args.brokers}
    curve: dict = {b: {} for b in args.brokers}
    counter = iter(range(1, 10**6))
    if args.output:
        out = args.output
    elif args.quick:
        out = Path(tempfile.mkdtemp(prefix="conveyor-bench-scale-")) / "RESULTS-scale.md"
    else:
        out = HERE / "RESULTS-scale.md"
    plot = out.with_name("scale.png")
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        """The report so far: written after every cell, so a run cut short still leaves its figures."""
        write_report(out, plot, args, cells, curve, loads)
        try:
            draw(plot, args, cells, curve)
        except ImportError:
            log("matplotlib is missing (pip install -e '.[bench]'): no plot")

    with Servers.start(pg_durable=args.pg_durable) as servers:
        log(f"servers up: redis {servers.redis_url}, pg {servers.pg.url()}")
        for round_ in range(args.rounds):
            load()
            if args.curve_jobs:
                for processes in args.curve_processes:
                    for broker in args.brokers:
                        log(f"round {round_ + 1} {broker}: {processes} processes, {args.curve_jobs:,} jobs")
                        result = runner.measure_throughput(
                            get_peer(PEERS[broker]),
                            servers,
                            jobs=args.curve_jobs,
                            processes=processes,
                            threads=args.threads,
                            tag=f"c{next(counter)}",
                        )
                        log(f"  {result.rate:,.0f} jobs/s")
                        curve[broker].setdefault(processes, []).append(result)
                        save()
            plan: list[tuple[str, dict]] = []
            for backlog in args.backlogs:
                if backlog > 100_000 and round_ >= args.big_rounds:
                    continue
                plan.append((f"backlog {backlog:,}", {"backlog": backlog}))
            base = args.backlogs[0]
            if args.dedup_keys:
                plan.append(
                    (
                        f"backlog {base:,} + {args.dedup_keys:,} live dedup keys",
                        {"backlog": base, "dedup_keys": args.dedup_keys},
                    )
                )
            if args.history and round_ < args.big_rounds:
                plan.append(
                    (
                        f"backlog {base:,} + {args.history:,} finished kept",
                        {"backlog": base, "history": args.history, "only": "postgres"},
                    )
                )
            for label, spec in plan:
                for broker in args.brokers:
                    if spec.get("only", broker) != broker:
                        continue
                    kwargs = {k: v for k, v in spec.items() if k != "only"}
                    log(f"round {round_ + 1} {broker}: {label}")
                    cell = measure_cell(
                        servers,
                        broker,
                        warmup=args.warmup,
                        window=args.window,
                        processes=args.processes,
                        threads=args.threads,
                        tag=f"s{next(counter)}",
                        **kwargs,
                    )
                    log(
                        f"  {cell.rate:,.0f} jobs/s, worker {cell.worker_cpu_ms:.2f} ms/job, server {cell.server_cpu_ms:.2f} ms/job {cell.notes.get('claim_plan', '')}"
                    )
                    cells[broker].setdefault(label, []).append(cell)
                    save()
        servers.drop_databases()
    load()
    save()
    log(f"wrote {out} and {plot}")
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

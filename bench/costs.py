"""What one job costs the servers, counted: round trips, commands or statements, server CPU, WAL, per job.

    .venv/bin/python -m bench.costs [--jobs 2000] [--only conveyor-redis,...] [--output bench/RESULTS-costs.md]

For each peer, on private servers (Postgres durable: fsync and synchronous
commit on, with ``pg_stat_statements``), two phases of ``--jobs`` jobs:

* **enqueue**: one producer call per job (conveyor: ``app.jobs.enqueue`` with
  a dedup key; Dramatiq: ``send``);
* **drain**: the peer's own worker processes (``--processes`` x
  ``--threads``, as ``bench`` runs them) run every job.

Redis is counted twice, so that counting never slows what is timed: once
with ``INFO commandstats`` (server µs per command) and once under
``MONITOR``, which sees each command a client sent (a round trip, named by
the script's first argument, its command) and each command a script ran
(classified by the key it touched: the job record, the ready list, the
fence...). Postgres: ``pg_stat_statements`` (calls and execution time per
statement, named by the ``-- name:`` of the ``.sql`` file it came from),
``pg_stat_database`` (transactions), ``pg_stat_wal`` (WAL bytes, records,
and syncs: the disk flushes a durable server pays). CPU of the server
processes comes from /proc. Counts are exact and do not depend on the
machine's load; times do (compare peers within one run).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import redis  # noqa: E402

from bench.peers import get_peer  # noqa: E402
from bench.probe import Probe  # noqa: E402
from bench.runner import Workers, drain_timeout, running, wait_for_jobs  # noqa: E402
from bench.servers import DURABLE, Servers  # noqa: E402
from conveyor.queries import load_queries  # noqa: E402
from tests.support.servers import PostgresServer, RedisServer  # noqa: E402

PEERS = ("conveyor-redis", "dramatiq-redis", "conveyor-postgres", "dramatiq-postgres")

#: Commands the harness itself sends (resetting and reading the statistics, MONITOR): never counted.
HARNESS = {"config", "info", "monitor", "hello", "client", "ping", "flushall", "select", "echo"}

#: What a key a script touches is for, by its name (keys.py): the first pattern that matches names it.
KEY_CLASSES: tuple[tuple[str, str], ...] = (
    (r":job:", "job record"),
    (r":attempts:", "attempt history"),
    (r":deleted:", "deletion tombstone"),
    (r":rollup:", "charts' rollup"),
    (r":fleet:worker", "worker registry"),
    (r":idx:", "state index"),
    (r":dedup:|:deduplicated:", "dedup key"),
    (r"__acks__|__acksets__", "delivery (acks)"),
    (r"__heartbeats__|__maintained_at__", "worker registry"),
    (r":totals:|:fleet:", "counters"),
    (r":wake:", "wake-up"),
    (r":running:|:gready:|:groups:|:gweights:|:gturn:|:gstamp:|:group:", "groups"),
    (r":paused$|:cancel", "pause / cancel"),
    (r"\.msgs$|\.XQ", "message body"),
    (r"\.levels$|\.ranks$|\.p\d$", "priorities"),
    (r"", "ready list"),
)

#: Record fields a script writes, by what they are for (the job record's share split by field).
FENCE_FIELDS = {"delivery", "rid", "worker"}
ATTEMPT_FIELDS = {"attempts"}


def classify_key(key: str) -> str:
    for pattern, name in KEY_CLASSES:
        if re.search(pattern, key):
            return name
    return "other"


@dataclass
class Cost:
    """One phase of one peer: what the servers saw, per job."""

    jobs: int
    round_trips: Counter = field(default_factory=Counter)  # client command (script command) -> calls
    inner: Counter = field(default_factory=Counter)  # (what, command) -> calls made by scripts
    usec: Counter = field(default_factory=Counter)  # Redis: command -> server µs
    statements: Counter = field(default_factory=Counter)  # Postgres: statement name -> calls
    statement_ms: Counter = field(default_factory=Counter)  # Postgres: statement name -> execution ms
    xacts: int = 0
    wal_bytes: int = 0
    wal_records: int = 0
    wal_syncs: int = 0
    server_cpu_s: float = 0.0
    worker_cpu_s: float = 0.0
    seconds: float = 0.0

    def per_job(self, value: float) -> float:
        return value / self.jobs if self.jobs else 0.0


# --- Redis ------------------------------------------------------------------------------------------


class Monitor:
    """Counts what a Redis server runs while it is open: client commands and the commands scripts run."""

    def __init__(self, url: str, cost: Cost) -> None:
        self.client = redis.Redis.from_url(url)
        self.cost = cost
        self.monitor = self.client.monitor()
        self.monitor.connection.send_command("MONITOR")
        self.monitor.connection.read_response()
        self.stopped = threading.Event()
        self.sentinel = f"bench-costs-end-{uuid.uuid4().hex}"
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while True:
            try:
                entry = self.monitor.next_command()
            except (redis.ConnectionError, OSError):
                return
            except Exception:  # noqa: BLE001 - a line redis-py cannot parse is counted, not fatal
                self.cost.round_trips["(unparsed)"] += 1
                continue
            if entry["command"] == f"ECHO {self.sentinel}":
                self.stopped.set()
                return
            self._count(entry)

    def _count(self, entry: dict) -> None:
        words = entry["command"].split(" ")
        name = words[0].lower()
        if name in HARNESS:
            return
        if entry.get("client_type") == "lua":
            what = classify_key(words[1]) if len(words) > 1 else "server clock (TIME)"
            if what == "job record" and name in {"hset", "hincrby", "hmset"}:
                fields = set(words[2::2]) if name != "hincrby" else {words[2]}
                what = (
                    "fence"
                    if fields & FENCE_FIELDS and len(fields) <= 2
                    else "attempts"
                    if fields <= ATTEMPT_FIELDS
                    else what
                )
            self.cost.inner[(what, name)] += 1
            return
        if name in {"evalsha", "eval", "fcall"} and len(words) > 2:
            keys = int(words[2]) if words[2].isdigit() else 0
            command = words[3 + keys] if len(words) > 3 + keys else "?"
            self.cost.round_trips[f"{name} {command}"] += 1
        else:
            self.cost.round_trips[name] += 1

    def close(self) -> None:
        """Wait until MONITOR has shown everything sent before now (it lags behind a busy server)."""
        self.client.echo(self.sentinel)
        self.stopped.wait(120)
        self.thread.join(5)
        self.monitor.connection.disconnect()
        self.client.close()
        if not self.stopped.is_set():
            raise RuntimeError("MONITOR fell behind by more than two minutes: the counts would be short")


def redis_commandstats(url: str) -> Counter:
    client = redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return Counter(
        {
            name.removeprefix("cmdstat_"): value["usec"]
            for name, value in stats.items()
            if name.split("_", 1)[1].split("|")[0] not in HARNESS
        }
    )


def redis_reset(url: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        client.config_resetstat()
    finally:
        client.close()


# --- Postgres ---------------------------------------------------------------------------------------


def _shape(sql: str) -> str:
    """A statement reduced to compare across the two spellings: no comments, parameters as ?, one space."""
    sql = re.sub(r"--[^\n]*", " ", sql)
    sql = re.sub(r"%\(\w+\)[sbt]|%[sbt]|\$\d+", "?", sql)
    return re.sub(r"\s+", " ", sql).strip().lower()


def statement_names() -> list[tuple[str, str]]:
    """(shape, module:name) of every named query conveyor ships."""
    names = []
    for path in sorted((ROOT / "conveyor").rglob("*.sql")):
        if "migrations" in path.parts:
            continue
        try:
            queries = load_queries(path)
        except ValueError:
            continue
        for name, sql in queries.items():
            names.append((_shape(sql), f"{path.stem}:{name}"))
    return names


def name_statement(query: str, names: list[tuple[str, str]]) -> str:
    shape = _shape(query)
    best, best_len = shape[:70], 40
    for known, name in names:
        if shape == known:
            return name
        common = len(os.path.commonprefix([shape, known]))
        if common > best_len:
            best, best_len = name, common
    return best


def pg_snapshot(url: str) -> dict:
    with psycopg.connect(url, autocommit=True) as conn:
        (xacts,) = conn.execute("SELECT coalesce(sum(xact_commit + xact_rollback), 0) FROM pg_stat_database").fetchone()
        wal = conn.execute("SELECT wal_bytes, wal_records, wal_sync FROM pg_stat_wal").fetchone()
        rows = conn.execute(
            "SELECT query, calls, total_exec_time FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat%'"
        ).fetchall()
    return {"xacts": int(xacts), "wal": tuple(int(v) for v in wal), "statements": rows}


def pg_reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")
        conn.execute("SELECT pg_stat_reset_shared('wal')")


def pg_fill(cost: Cost, before: dict, after: dict, names) -> None:
    cost.xacts = after["xacts"] - before["xacts"]
    cost.wal_bytes, cost.wal_records, cost.wal_syncs = (a - b for a, b in zip(after["wal"], before["wal"]))
    for query, calls, ms in after["statements"]:
        if re.match(r"\s*(begin|commit|rollback|set |show |select pg_|listen|unlisten)", query, re.I):
            name = query.split()[0].lower()
        else:
            name = name_statement(query, names)
        cost.statements[name] += calls
        cost.statement_ms[name] += ms


# --- the phases --------------------------------------------------------------------------------------


def enqueue_phase(peer, env, jobs: int) -> float:
    producer = peer.producer(env)
    try:
        started = time.perf_counter()
        for i in range(jobs):
            producer.send({"i": i, "t": 0.0})
        return time.perf_counter() - started
    finally:
        producer.close()


def drain_phase(peer, env, servers, jobs: int, processes: int, threads: int, measure) -> Cost:
    """The workers run every job; the statistics are read once they have exited (Postgres backends
    report their counts at exit, not at every statement)."""
    probe = Probe.create(processes)
    with measure as cost:
        with running(Workers(peer, env, processes, threads, probe, servers.run_dir)) as workers:
            cpu, server_cpu = workers.cpu_seconds(), servers.cpu_seconds()
            started = time.perf_counter()
            workers.release()
            wait_for_jobs(probe, jobs, workers, drain_timeout(jobs))
            time.sleep(0.3)  # batched acks and outcomes reach the server
            cost.seconds = time.perf_counter() - started
            cost.worker_cpu_s = workers.cpu_seconds() - cpu
            cost.server_cpu_s = servers.cpu_seconds() - server_cpu
        time.sleep(1.0)  # the killed workers' backends end and report
    return cost


class Measure:
    """Resets a server's statistics on entry and reads them into a new :class:`Cost` on exit (reusable)."""

    def __init__(self, peer, servers, env, jobs: int, monitor: bool, names) -> None:
        self.peer, self.servers, self.env, self.jobs, self.monitor, self.names = (
            peer,
            servers,
            env,
            jobs,
            monitor,
            names,
        )

    def __enter__(self) -> Cost:
        self.cost = Cost(self.jobs)
        if self.peer.backend == "redis":
            redis_reset(self.servers.redis_url)
            self._monitor = Monitor(self.servers.redis_url, self.cost) if self.monitor else None
        else:
            self._url = self.env["database_url"]
            with psycopg.connect(self._url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            pg_reset(self._url)
            self._before = pg_snapshot(self._url)
        return self.cost

    def __exit__(self, *exc) -> None:
        if self.peer.backend == "redis":
            if self._monitor:
                self._monitor.close()
            else:
                self.cost.usec = redis_commandstats(self.servers.redis_url)
        else:
            pg_fill(self.cost, self._before, pg_snapshot(self._url), self.names)


def measure_peer(name: str, servers, args, names) -> dict[str, Cost]:
    peer = get_peer(name)
    out: dict[str, Cost] = {}
    passes = (False, True) if peer.backend == "redis" else (False,)
    for monitor in passes:
        suffix = " (counted)" if monitor else ""
        env = peer.setup(servers, f"costs{int(monitor)}")
        measure = Measure(peer, servers, env, args.jobs, monitor, names)
        with measure as cost:
            server_cpu = servers.cpu_seconds()
            cost.seconds = enqueue_phase(peer, env, args.jobs)
            cost.server_cpu_s = servers.cpu_seconds() - server_cpu
        out["enqueue" + suffix] = cost
        out["drain" + suffix] = drain_phase(peer, env, servers, args.jobs, args.processes, args.threads, measure)
    return out


# --- the report ----------------------------------------------------------------------------------------


def _f(value: float, digits: int = 2) -> str:
    return f"{value:,.{digits}f}"


def report_redis(name: str, phases: dict[str, Cost]) -> list[str]:
    lines = [f"### {name}", ""]
    for phase in ("enqueue", "drain"):
        timed, counted = phases[phase], phases[phase + " (counted)"]
        trips = sum(counted.round_trips.values())
        inner = sum(counted.inner.values())
        # A script's time includes the commands it ran, which commandstats also counts under their own names.
        usec = sum(v for k, v in timed.usec.items() if k.split("|")[0] in {"evalsha", "eval", "fcall", "evalsha_ro"})
        lines += [
            f"**{phase}**: {_f(counted.per_job(trips))} round trips and {_f(counted.per_job(inner))} commands run by "
            f"scripts per job; Redis {_f(timed.per_job(usec), 1)} µs in scripts and "
            f"{_f(timed.per_job(timed.server_cpu_s) * 1e6, 1)} µs of process CPU per job"
            + (
                f"; worker CPU {_f(timed.per_job(timed.worker_cpu_s) * 1e6, 0)} µs per job"
                if timed.worker_cpu_s
                else ""
            )
            + ".",
            "",
            "| round trip (client command) | per job |",
            "|---|---|",
        ]
        for command, calls in counted.round_trips.most_common():
            lines.append(f"| `{command}` | {_f(counted.per_job(calls))} |")
        if counted.inner:
            lines += ["", "| what a script touched | commands per job | of which |", "|---|---|---|"]
            by_what: Counter = Counter()
            for (what, _command), calls in counted.inner.items():
                by_what[what] += calls
            for what, calls in by_what.most_common():
                detail = ", ".join(
                    f"{command.upper()} {_f(counted.per_job(c))}"
                    for (w, command), c in counted.inner.most_common()
                    if w == what
                )
                lines.append(f"| {what} | {_f(counted.per_job(calls))} | {detail} |")
        lines += ["", "| command (a script's time includes its commands') | server µs per job |", "|---|---|"]
        for command, usec in timed.usec.most_common(8):
            lines.append(f"| `{command}` | {_f(timed.per_job(usec), 1)} |")
        lines.append("")
    return lines


def report_postgres(name: str, phases: dict[str, Cost]) -> list[str]:
    lines = [f"### {name}", ""]
    for phase in ("enqueue", "drain"):
        cost = phases[phase]
        calls = sum(v for k, v in cost.statements.items() if k not in {"begin", "commit", "rollback"})
        ms = sum(cost.statement_ms.values())
        lines += [
            f"**{phase}**: {_f(cost.per_job(calls))} statements, {_f(cost.per_job(cost.xacts))} transactions, "
            f"{_f(cost.per_job(cost.wal_syncs))} WAL syncs, {_f(cost.per_job(cost.wal_records), 1)} WAL records and "
            f"{_f(cost.per_job(cost.wal_bytes), 0)} WAL bytes per job; {_f(cost.per_job(ms) * 1000, 1)} µs of "
            f"statement time and {_f(cost.per_job(cost.server_cpu_s) * 1e6, 1)} µs of server CPU per job"
            + (f"; worker CPU {_f(cost.per_job(cost.worker_cpu_s) * 1e6, 0)} µs per job" if cost.worker_cpu_s else "")
            + ".",
            "",
            "| statement | calls per job | µs per job |",
            "|---|---|---|",
        ]
        for statement, count in cost.statements.most_common(14):
            lines.append(
                f"| `{statement}` | {_f(cost.per_job(count), 3)} | {_f(cost.per_job(cost.statement_ms[statement]) * 1000, 1)} |"
            )
        lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--only", default=",".join(PEERS))
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "RESULTS-costs.md")
    args = parser.parse_args()
    names = statement_names()
    settings = {**DURABLE, "shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "top"}
    redis_server = RedisServer(tempfile.mkdtemp(prefix="conveyor-costs-redis-"))
    pg = PostgresServer(tempfile.mkdtemp(prefix="conveyor-costs-pg-"), settings=settings)
    run_dir = Path(tempfile.mkdtemp(prefix="conveyor-costs-"))
    servers = Servers(redis_server.url, pg, run_dir, owned=(redis_server, pg), pg_durable=True)
    lines = [
        "# What a job costs the servers",
        "",
        f"`python -m bench.costs --jobs {args.jobs}` ({args.processes} worker processes x {args.threads} threads), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; Postgres durable (fsync, synchronous_commit on). "
        "Counts are exact; times move with the machine's load.",
        "",
    ]
    try:
        for name in args.only.split(","):
            if get_peer(name).unavailable():
                continue
            phases = measure_peer(name, servers, args, names)
            report = report_redis if get_peer(name).backend == "redis" else report_postgres
            lines += report(name, phases)
            print("\n".join(report(name, phases)), flush=True)
    finally:
        servers.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    args.output.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

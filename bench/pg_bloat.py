"""Bloat with a held transaction: how each Postgres broker's job tables grow, and recover, behind an old snapshot.

    .venv/bin/python -m bench.pg_bloat [--rate 100] [--duration 150] [--hold-at 30] [--hold 60]
        [--sample 2] [--count-jobs 1000] [--threads 8] [--rounds 1] [--only conveyor-postgres,...]

On a private durable Postgres (fsync and synchronous_commit on, the
server's default autovacuum, naptime 1 min, unless ``--naptime``), for each peer on a fresh
database, through the peer's own worker process (bench/peers):

1. Row versions per job: one worker drains ``--count-jobs`` jobs enqueued
   one call each, with nothing else running; the growth of each table's
   ``n_tup_ins / n_tup_upd / n_tup_hot_upd / n_tup_del`` (pg_stat_user_tables)
   divided by the jobs. A table that moved by at least half a row per job
   is one of the peer's *job tables* (worker heartbeats and the like are not).
2. Bloat: a fresh database, a worker draining, jobs enqueued one call each
   at a steady ``--rate`` for ``--duration`` s; at ``--hold-at`` s another
   connection to the same database opens a REPEATABLE READ transaction,
   reads, and holds its snapshot for ``--hold`` s, then commits. Every
   ``--sample`` s: pg_total_relation_size (heap, indexes, TOAST) and
   n_live_tup / n_dead_tup of the job tables. Reported: size when the hold
   began, at its peak and at the end (after the worker drained), the peak
   of dead tuples, and the seconds after the release until dead tuples were
   at most half that peak (their half-life), with the queue's peak lag
   (enqueued minus run) to show whether claims slowed behind the snapshot.

``conveyor-postgres-0078`` is conveyor without migration 0079 (the job
tables' fillfactor and autovacuum settings): the "before" of that change,
interleaved with the "after" in the same run. ``--rounds`` repeats every
peer, in the same order each round. The report goes to bench/RESULTS-bloat.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psycopg

from .peers import get_peer
from .probe import Probe
from .runner import Workers, running, wait_for_jobs
from .servers import Servers

DEFAULT_OUTPUT = Path(__file__).with_name("RESULTS-bloat.md")

#: The peers of a default run (about 9 minutes), in run order.
PEER_NAMES = ("conveyor-postgres", "dramatiq-postgres", "procrastinate")
#: Every peer this bench knows: also the "before" of migration 0079, to interleave with its "after".
KNOWN = ("conveyor-postgres-0078", *PEER_NAMES)

#: The migration the "before" variant leaves out.
BLOAT_MIGRATION = "0079_job_tables_bloat.sql"

#: Postgres sends a busy backend's table counters at most once a second, an idle one's
#: within 10 s.
STATS_SETTLE_S = 11.0

STATS = """
SELECT s.relname, pg_total_relation_size(s.relid), s.n_live_tup, s.n_dead_tup,
       s.n_tup_ins, s.n_tup_upd, s.n_tup_hot_upd, s.n_tup_del, s.autovacuum_count, s.vacuum_count
FROM pg_stat_user_tables s
"""


def table_stats(url: str) -> dict[str, tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return {row[0]: row[1:] for row in conn.execute(STATS)}


# -- the "before" variant ---------------------------------------------------------


class ConveyorWithout0079:
    """conveyor's Postgres broker on every migration but 0079: served exactly as conveyor-postgres."""

    name = "conveyor-postgres-0078"
    serves_as = "conveyor-postgres"

    def setup(self, servers, tag: str) -> dict:
        from conveyor.schema.migrate import QUERIES, migrate

        url = servers.fresh_database("conveyor")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(QUERIES["create_table"])
            conn.execute(QUERIES["record"], {"name": BLOAT_MIGRATION})
        migrate(url)
        return {"broker": "postgres", "database_url": url, "run_dir": str(servers.run_dir), "tag": tag}

    def producer(self, env: dict):
        return get_peer(self.serves_as).producer(env)


def peer_for(name: str):
    return ConveyorWithout0079() if name == ConveyorWithout0079.name else get_peer(name)


# -- the measurements --------------------------------------------------------------


@dataclass
class Versions:
    """Per job: rows inserted, updated (HOT among them) and deleted, per table."""

    jobs: int
    per_table: dict[str, tuple[float, float, float, float]]  # ins, upd, hot, del per job


@dataclass
class Bloat:
    tables: list[str]
    samples: list[tuple[float, int, int, int, int]] = field(default_factory=list)  # t, bytes, live, dead, lag
    per_table_bytes: dict[str, list[int]] = field(default_factory=dict)
    hold_start: float = 0.0
    release: float = 0.0
    sent: int = 0
    end_bytes: int = 0
    end_dead: int = 0
    rate: float = 0.0

    def at(self, t: float) -> tuple:
        return min(self.samples, key=lambda s: abs(s[0] - t))

    @property
    def before_bytes(self) -> int:
        return self.at(self.hold_start)[1]

    @property
    def peak_bytes(self) -> int:
        return max(s[1] for s in self.samples)

    @property
    def dead_peak(self) -> int:
        return max(s[3] for s in self.samples)

    @property
    def lag_peak(self) -> int:
        return max(s[4] for s in self.samples)

    def half_life(self) -> float | None:
        """Seconds after the release until dead tuples were at most half their peak since the release."""
        after = [s for s in self.samples if s[0] >= self.release]
        if not after:
            return None
        peak = max(s[3] for s in after)
        peak_at = next(s[0] for s in after if s[3] == peak)
        return next((s[0] - self.release for s in after if s[0] >= peak_at and s[3] <= peak / 2), None)

    def held_kb_per_job(self) -> float:
        """Growth of the job tables while the snapshot was held, per job enqueued meanwhile."""
        return (
            (self.at(self.release)[1] - self.before_bytes)
            / 1e3
            / max(1.0, self.rate * (self.release - self.hold_start))
        )

    def observed_after_release(self) -> float:
        return self.samples[-1][0] - self.release


def count_versions(peer, servers, args, tag: str) -> Versions:
    env = peer.setup(servers, tag)
    url = env["database_url"]
    probe = Probe.create(1)
    serve_name = getattr(peer, "serves_as", peer.name)
    with running(Workers(get_peer(serve_name), env, 1, args.threads, probe, servers.run_dir)) as workers:
        workers.release()
        time.sleep(2.0)  # booted, consumers listening
        _settle(url)
        before = table_stats(url)
        producer = peer.producer(env)
        try:
            for i in range(args.count_jobs):
                producer.send({"i": i, "t": 0.0})
        finally:
            producer.close()
        wait_for_jobs(probe, args.count_jobs, workers, 120)
        after = _settle(url)
    per_table = {}
    for name, row in after.items():
        old = before.get(name, (0,) * 9)
        moved = [row[k] - old[k] for k in (3, 4, 5, 6)]
        if sum(moved) >= args.count_jobs / 2:
            per_table[name] = tuple(m / args.count_jobs for m in moved)
    return Versions(args.count_jobs, per_table)


def _settle(url: str) -> dict[str, tuple]:
    """The table counters once every backend has sent its own (an idle one's wait up to 10 s)."""
    time.sleep(STATS_SETTLE_S)
    return table_stats(url)


def hold_snapshot(url: str, seconds: float, started: threading.Event) -> None:
    """The accident: a transaction elsewhere in the database that keeps its snapshot for ``seconds``."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM pg_class").fetchone()
        started.set()
        time.sleep(seconds)
        conn.execute("COMMIT")


def measure_bloat(peer, servers, args, tables: list[str], tag: str) -> Bloat:
    env = peer.setup(servers, tag)
    url = env["database_url"]
    probe = Probe.create(1)
    result = Bloat(tables=tables, per_table_bytes={t: [] for t in tables})
    serve_name = getattr(peer, "serves_as", peer.name)
    stop = threading.Event()
    sent = [0]

    def sample(t0: float) -> None:
        stats = table_stats(url)
        rows = [stats.get(t, (0, 0, 0)) for t in tables]
        result.samples.append(
            (
                time.monotonic() - t0,
                sum(r[0] for r in rows),
                sum(r[1] for r in rows),
                sum(r[2] for r in rows),
                sent[0] - probe.total(),
            )
        )
        for t, r in zip(tables, rows):
            result.per_table_bytes[t].append(r[0])

    with running(Workers(get_peer(serve_name), env, 1, args.threads, probe, servers.run_dir)) as workers:
        workers.release()
        time.sleep(2.0)
        producer = peer.producer(env)
        t0 = time.monotonic()

        def sampler() -> None:
            next_at = t0
            while not stop.is_set():
                sample(t0)
                next_at += args.sample
                stop.wait(max(0.0, next_at - time.monotonic()))

        held = threading.Event()
        holder = threading.Timer(args.hold_at, hold_snapshot, args=(url, args.hold, held))
        holder.daemon = True
        sampling = threading.Thread(target=sampler, daemon=True)
        sampling.start()
        holder.start()
        try:
            end = t0 + args.duration
            i = 0
            while True:
                due = t0 + i / args.rate
                if due >= end:
                    break
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                producer.send({"i": i, "t": 0.0})
                i += 1
                sent[0] = i
            result.sent = i
            result.rate = i / (time.monotonic() - t0)
            holder.join()
            wait_for_jobs(probe, i, workers, 120)
        finally:
            producer.close()
            stop.set()
            sampling.join()
            holder.cancel()
        result.hold_start = args.hold_at
        result.release = args.hold_at + args.hold
        time.sleep(args.sample)
        sample(t0)
    return result


# -- the report --------------------------------------------------------------------


def mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


def render(args, results: dict[str, list[tuple[Versions, Bloat]]], load: list[str]) -> str:
    results = {name: runs for name, runs in results.items() if runs}
    lines = [
        "# Bloat with a held transaction",
        "",
        "Written by `python -m bench.pg_bloat` "
        f"(`--rate {args.rate:g} --duration {args.duration:g} --hold-at {args.hold_at:g} --hold {args.hold:g} "
        f"--sample {args.sample:g} --count-jobs {args.count_jobs} --threads {args.threads} --rounds {args.rounds}"
        + (f" --naptime {args.naptime}" if args.naptime else "")
        + "`), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "A private durable Postgres (fsync, synchronous_commit on; autovacuum as Postgres ships it, naptime "
        f"{args.naptime or '60 s'}), one worker process per peer with its own CLI worker's setup (bench/peers), "
        "jobs enqueued "
        f"one call each at ~{args.rate:g}/s for {args.duration:g} s. At {args.hold_at:g} s a REPEATABLE READ "
        f"transaction on the same database reads and keeps its snapshot for {args.hold:g} s. Sizes are "
        "pg_total_relation_size (heap, indexes, TOAST) summed over the peer's job tables: the tables that "
        "moved by at least half a row per job in the quiet drain below. *Half-life*: seconds after the "
        "release until dead tuples were at most half their peak (sampled every "
        f"{args.sample:g} s; `>N` = not within the N s observed). Lag: jobs enqueued but not yet run.",
        "",
        f"Load (`uptime`) while measuring: {'; '.join(load)}.",
        "",
        "## Growth and recovery",
        "",
        "| peer | round | jobs/s | MB when held | MB at release | MB peak | MB at end | kB per job held "
        "| dead tuples peak | half-life after release | lag peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        for n, (_, b) in enumerate(runs, 1):
            hl = b.half_life()
            half = f"{hl:.0f} s" if hl is not None else f">{b.observed_after_release():.0f} s"
            lines.append(
                f"| {name} | {n} | {b.rate:.0f} | {mb(b.before_bytes)} | {mb(b.at(b.release)[1])} | "
                f"{mb(b.peak_bytes)} | {mb(b.samples[-1][1])} | {b.held_kb_per_job():.2f} | {b.dead_peak:,} | "
                f"{half} | {b.lag_peak:,} |"
            )
    if args.rounds > 1:
        lines += ["", "Medians over the rounds (range):", ""]
        lines += ["| peer | MB peak | kB per job held | dead tuples peak | half-life s |", "|---|---|---|---|---|"]
        for name, runs in results.items():
            peaks = [b.peak_bytes / 1e6 for _, b in runs]
            perjob = [b.held_kb_per_job() for _, b in runs]
            deads = [b.dead_peak for _, b in runs]
            halves = [b.half_life() for _, b in runs]
            known = [h for h in halves if h is not None]
            half = (
                f"{statistics.median(known):.0f} ({min(known):.0f}–{max(known):.0f})"
                + (f", {len(halves) - len(known)} not within the run" if len(known) < len(halves) else "")
                if known
                else "none within the run"
            )
            lines.append(
                f"| {name} | {statistics.median(peaks):.1f} ({min(peaks):.1f}–{max(peaks):.1f}) | "
                f"{statistics.median(perjob):.2f} ({min(perjob):.2f}–{max(perjob):.2f}) | "
                f"{statistics.median(deads):,.0f} ({min(deads):,}–{max(deads):,}) | {half} |"
            )
    lines += [
        "",
        "## Row versions per job (quiet drain)",
        "",
        f"{args.count_jobs:,} jobs enqueued one call each while one worker drains, nothing else running; the "
        "growth of pg_stat_user_tables' counters divided by the jobs. Every insert and every update writes a "
        "row version; an update is HOT when it changes no indexed column (nor any column an index's predicate "
        "reads) and its page has room: then no index gets a new entry and the old version can be pruned "
        "from the page without a vacuum.",
        "",
        "| peer | table | inserts | updates | of which HOT | deletes | row versions |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        v = runs[0][0]
        for table, (ins, upd, hot, dele) in sorted(v.per_table.items()):
            lines.append(f"| {name} | {table} | {ins:.2f} | {upd:.2f} | {hot:.2f} | {dele:.2f} | {ins + upd:.2f} |")
    lines += ["", "## Size of each job table (MB: when held / peak / end), first round", ""]
    for name, runs in results.items():
        b = runs[0][1]
        hold_index = b.samples.index(b.at(b.hold_start))
        parts = [
            f"{t} {mb(sizes[hold_index])} / {mb(max(sizes))} / {mb(sizes[-1])}"
            for t, sizes in b.per_table_bytes.items()
            if sizes
        ]
        lines.append(f"- {name}: " + "; ".join(parts))
    lines += ["", "## Samples, first round (t s: MB, dead tuples, lag)", ""]
    for name, runs in results.items():
        b = runs[0][1]
        row = ", ".join(f"{s[0]:.0f}: {mb(s[1])}/{s[3]:,}/{s[4]}" for s in b.samples[:: max(1, len(b.samples) // 40)])
        lines.append(f"- {name}: {row}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=100.0, help="jobs enqueued per second (default 100)")
    parser.add_argument("--duration", type=float, default=150.0, help="seconds of enqueueing (default 150)")
    parser.add_argument("--hold-at", type=float, default=30.0, help="when the snapshot is taken, s (default 30)")
    parser.add_argument("--hold", type=float, default=60.0, help="how long it is held, s (default 60)")
    parser.add_argument("--sample", type=float, default=2.0, help="seconds between samples (default 2)")
    parser.add_argument("--count-jobs", type=int, default=1000, help="jobs of the row-version count (default 1000)")
    parser.add_argument("--threads", type=int, default=8, help="worker threads (concurrency) (default 8)")
    parser.add_argument(
        "--naptime",
        help="the server's autovacuum_naptime, e.g. 10s (default: Postgres' own, 1min), set by ALTER SYSTEM",
    )
    parser.add_argument("--rounds", type=int, default=1, help="times every peer runs, interleaved (default 1)")
    parser.add_argument(
        "--only", help=f"comma-separated peers of {', '.join(KNOWN)} (default: {', '.join(PEER_NAMES)})"
    )
    parser.add_argument("--raw", type=Path, help="also write every sample and count here, as JSON")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help=f"report path (default {DEFAULT_OUTPUT})")
    args = parser.parse_args()
    # A TERM (or an INT to a background job, which ignores INT) still stops the workers and servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    names = args.only.split(",") if args.only else list(PEER_NAMES)
    unknown = sorted(set(names) - set(KNOWN))
    if unknown:
        parser.error(f"unknown peers: {', '.join(unknown)}")
    results: dict[str, list[tuple[Versions, Bloat]]] = {name: [] for name in names}
    load = []
    with Servers.start(pg_durable=True) as servers:
        if args.naptime:
            with servers.pg.connect() as conn:
                conn.execute(f"ALTER SYSTEM SET autovacuum_naptime = '{args.naptime}'")
                conn.execute("SELECT pg_reload_conf()")
        for round_ in range(args.rounds):
            for name in names:
                peer = peer_for(name)
                load.append(f"{name} r{round_ + 1}: {_uptime()}")
                versions = count_versions(peer, servers, args, f"v{round_}")
                bloat = measure_bloat(peer, servers, args, sorted(versions.per_table), f"b{round_}")
                results[name].append((versions, bloat))
                hl = bloat.half_life()
                half = f"{hl:.0f} s" if hl is not None else "none"
                print(
                    f"{name} r{round_ + 1}: {mb(bloat.before_bytes)} -> peak {mb(bloat.peak_bytes)} MB, "
                    f"end {mb(bloat.samples[-1][1])} MB, dead peak {bloat.dead_peak:,}, "
                    f"half-life {half}, lag peak {bloat.lag_peak}; "
                    f"tables {', '.join(bloat.tables)}",
                    flush=True,
                )
                args.output.write_text(render(args, results, load))
                if args.raw:
                    args.raw.write_text(
                        json.dumps({n: [[asdict(v), asdict(b)] for v, b in r] for n, r in results.items()})
                    )
    args.output.write_text(render(args, results, load))
    print(f"wrote {args.output}")
    return 0


def _uptime() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


if __name__ == "__main__":
    raise SystemExit(main())

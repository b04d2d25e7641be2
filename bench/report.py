"""``bench/RESULTS.md``: the tables, the ratios against the issue's targets, versions and machine."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import statistics
import subprocess
from dataclasses import dataclass, field
from typing import Callable

from .credit import KINDS as CREDIT_KINDS
from .peers import PEERS

#: Distributions whose versions the report lists.
DISTRIBUTIONS = (
    "conveyor",
    "dramatiq",
    "redis",
    "celery",
    "kombu",
    "dramatiq-postgres",
    "procrastinate",
    "psycopg",
    "psycopg-pool",
    "pydantic",
)


@dataclass
class Results:
    """Everything one run measured: per scenario, per peer, one entry per repetition."""

    plan: dict
    throughput: dict = field(default_factory=dict)  # peer -> [Throughput]
    latency: dict = field(default_factory=dict)  # peer -> [Latency]
    credit: dict = field(default_factory=dict)  # kind -> [CreditRun]
    skipped: dict = field(default_factory=dict)  # peer -> why
    failures: list = field(default_factory=list)  # "scenario/peer rep n: message"
    notes: list = field(default_factory=list)
    started: datetime.datetime = field(default_factory=lambda: datetime.datetime.now(datetime.UTC))
    load_before: tuple = field(default_factory=os.getloadavg)
    load_after: tuple = ()
    wall_seconds: float = 0.0
    server_versions: dict = field(default_factory=dict)
    conveyor_middleware: list = field(default_factory=list)


@dataclass(frozen=True)
class Target:
    """One line of the issue's targets: ``value(results)`` is compared with ``bound``."""

    text: str
    kind: str  # "ratio" (>= bound) or "max_ms" (<= bound)
    bound: float
    numerator: str
    denominator: str | None = None


TARGETS = (
    Target("conveyor on Redis >= 0.85x bare Dramatiq throughput", "ratio", 0.85, "conveyor-redis", "dramatiq-redis"),
    Target("conveyor on Redis >= 3x Celery throughput", "ratio", 3.0, "conveyor-redis", "celery-redis"),
    Target(
        "conveyor's Postgres broker >= 1.0x dramatiq-postgres", "ratio", 1.0, "conveyor-postgres", "dramatiq-postgres"
    ),
    Target("conveyor's Postgres broker >= 3x procrastinate", "ratio", 3.0, "conveyor-postgres", "procrastinate"),
    Target("p50 enqueue-to-start <= 5 ms on Redis", "max_ms", 5.0, "conveyor-redis"),
    Target("p50 enqueue-to-start <= 15 ms on Postgres", "max_ms", 15.0, "conveyor-postgres"),
    Target("credit.consume path >= 0.8x the raw SQL", "ratio", 0.8, "credit:conveyor", "credit:sql"),
)


def spread(values: list[float], fmt: str = "{:,.0f}") -> str:
    """``median (min–max)``, or the one value, or a dash."""
    if not values:
        return "—"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def _series(results: Results, name: str) -> list[float]:
    """Per-repetition figure a target compares: throughput, credit rate or p50 latency."""
    if name.startswith("credit:"):
        return [r.rate for r in results.credit.get(name.split(":", 1)[1], [])]
    return [r.rate for r in results.throughput.get(name, [])]


def _why_missing(results: Results, name: str) -> str:
    if name in results.skipped:
        return results.skipped[name]
    return "not measured in this run" + (" (see failures)" if results.failures else "")


def evaluate(results: Results, target: Target) -> tuple[str, str, str]:
    """(measured figure, paired spread, verdict) for one target."""
    if target.kind == "max_ms":
        runs = results.latency.get(target.numerator, [])
        if not runs:
            return "—", "", _why_missing(results, target.numerator)
        p50s = [r.percentile(50) for r in runs]
        med = statistics.median(p50s)
        return f"p50 {med:.2f} ms", spread(p50s, "{:.2f}"), "PASS" if med <= target.bound else "MISS"
    top, bottom = _series(results, target.numerator), _series(results, target.denominator)
    if not top or not bottom:
        missing = target.numerator if not top else target.denominator
        return "—", "", _why_missing(results, missing)
    ratio = statistics.median(top) / statistics.median(bottom)
    # Repetition i of both ran back to back: their ratio cancels much of the machine's noise.
    paired = [a / b for a, b in zip(top, bottom) if b]
    return f"{ratio:.2f}x", spread(paired, "{:.2f}x"), "PASS" if ratio >= target.bound else "MISS"


def machine() -> dict:
    """nproc, CPU model, memory, kernel, Python."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = 0.0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_gib = int(line.split()[1]) / 1024 / 1024
                    break
    except OSError:
        pass
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": model,
        "memory": f"{mem_gib:.1f} GiB",
        "kernel": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def versions() -> dict:
    out = {}
    for dist in DISTRIBUTIONS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def git_revision() -> str:
    try:
        return (
            subprocess.run(
                ["git", "describe", "--always", "--dirty"],
                capture_output=True,
                text=True,
                timeout=10,
                cwd=os.path.dirname(__file__),
            ).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _absent(results: Results, scenario: str) -> str:
    """Why a row has no figures: the scenario was skipped, or its runs failed."""
    if not results.plan.get(scenario, True):
        return "not run (--skip / --only)"
    return "failed (see Failures)"


def _peer_rows(results: Results, backend: str, row: Callable) -> list[list[str]]:
    rows = []
    for name, peer in PEERS.items():
        if peer.backend != backend or name not in results.plan["peers_considered"]:
            continue
        if name in results.skipped:
            rows.append([peer.label, results.skipped[name]])
        else:
            rows.append([peer.label, *row(name)])
    return rows


def render(results: Results) -> str:
    plan = results.plan
    lines = [
        "# conveyor benchmarks",
        "",
        "Written by `python -m bench` (or `conveyor bench`); see `docs/bench.md` for how to run it and what each",
        "figure means. Every figure is the **median of "
        f"{plan['reps']} repetition(s), with min–max in brackets**. This machine is shared with other engineers,",
        "so absolute figures are noisy; the ratios compare peers measured back to back in the same run.",
        "",
        f"- date: {results.started:%Y-%m-%d %H:%M} UTC; wall time {results.wall_seconds / 60:.1f} min;"
        f" load average before {results.load_before[0]:.2f}, after "
        f"{results.load_after[0] if results.load_after else float('nan'):.2f} (1 min)",
        f"- run: {plan['jobs']:,} jobs per throughput run, {plan['processes']} processes x {plan['threads']} threads,"
        f" {plan['latency_jobs']} latency jobs one every {plan['interval_ms']:g} ms, {plan['credit_ops']:,}"
        f" credit charges; Postgres {'durable' if plan.get('pg_durable') else 'fsync off'};"
        f" conveyor at {git_revision()}"
        + (" (**--quick smoke run: too small to judge targets by**)" if plan.get("quick") else ""),
        "",
        "## Targets",
        "",
    ]
    rows = []
    for target in TARGETS:
        figure, paired, verdict = evaluate(results, target)
        rows.append([target.text, figure, paired, verdict])
    lines += _table(["target (issue 7)", "measured (ratio of medians)", "per repetition", "verdict"], rows)
    lines += ["", "## 1–2, 5. No-op throughput, bulk enqueue, worker memory", ""]
    lines += [
        f"{plan['jobs']:,} jobs enqueued first, then drained; rate = jobs / (last job start − first job start)."
        " CPU is all worker processes (resp. the Redis or Postgres server with its backends) during the"
        " drain, per job.",
        "",
    ]
    for backend in ("redis", "postgres"):

        def row(name):
            runs = results.throughput.get(name, [])
            if not runs:
                return [_absent(results, "throughput"), "", "", "", ""]
            return [
                spread([r.rate for r in runs]),
                spread([r.enqueue_rate for r in runs]),
                spread([max(r.peak_rss_kb) / 1024 for r in runs], "{:.0f}"),
                spread([r.worker_cpu_s / r.jobs * 1000 for r in runs], "{:.3f}"),
                spread([r.server_cpu_s / r.jobs * 1000 for r in runs], "{:.3f}"),
            ]

        rows = _peer_rows(results, backend, row)
        if rows:
            lines += [f"**{backend.capitalize()}**", ""]
            lines += _table(
                [
                    "peer",
                    "jobs/s",
                    "bulk enqueue jobs/s",
                    "peak RSS per worker process (MiB)",
                    "worker CPU ms/job",
                    "server CPU ms/job",
                ],
                rows,
            )
            lines.append("")
    lines += [
        "## 3. Enqueue-to-start latency (idle workers)",
        "",
        "Time from just before the enqueue call to the start of the job body, in ms.",
        "",
    ]
    for backend in ("redis", "postgres"):

        def row(name):
            runs = results.latency.get(name, [])
            if not runs:
                return [_absent(results, "latency"), "", "", ""]
            return [spread([r.percentile(p) for r in runs], "{:.2f}") for p in (50, 95, 99)] + [
                str(min(len(r.seconds) for r in runs))
            ]

        rows = _peer_rows(results, backend, row)
        if rows:
            lines += _table([f"peer ({backend})", "p50", "p95", "p99", "jobs timed"], rows)
            lines.append("")
    lines += [
        "## 4. credit.consume end to end vs the SQL it runs",
        "",
        f"{plan['credit_ops']:,} charges over 100 accounts from {plan['processes']} x {plan['threads']}"
        " threads; timed from the go signal to the last charge applied; ledger verified after each run.",
        "",
    ]
    labels = {
        "conveyor": "credit.consume jobs through conveyor on Redis (enqueued first)",
        "function": "ledger.credits.consume() on app.pool, no broker",
        "sql": "the apply_entry statement alone, one connection per thread",
    }
    rows = []
    sql = [r.rate for r in results.credit.get("sql", [])]
    for kind in CREDIT_KINDS:
        runs = results.credit.get(kind, [])
        if not runs:
            rows.append([labels[kind], _absent(results, "credit"), "", "", "", ""])
            continue
        rate = [r.rate for r in runs]
        vs = f"{statistics.median(rate) / statistics.median(sql):.2f}x" if sql else "—"
        rows.append(
            [
                labels[kind],
                spread(rate),
                vs,
                spread([r.worker_cpu_s / r.ops * 1000 for r in runs], "{:.3f}"),
                spread([r.server_cpu_s / r.ops * 1000 for r in runs], "{:.3f}"),
                "yes" if all(r.verified for r in runs) else "**NO**",
            ]
        )
    lines += _table(
        [
            "path",
            "charges/s",
            "vs raw SQL",
            "client CPU ms/charge",
            "Redis + Postgres CPU ms/charge",
            "ledger verified",
        ],
        rows,
    )
    lines += ["", "## How each peer ran", ""]
    for name, peer in PEERS.items():
        if name in plan["peers_considered"]:
            lines.append(f"- **{peer.label}** (`{name}`): {peer.describe()}.")
    if results.conveyor_middleware:
        lines.append(
            f"- conveyor's middleware in this run: {', '.join(results.conveyor_middleware)}"
            + (
                ""
                if any("etric" in m for m in results.conveyor_middleware)
                else " (no metrics middleware exists on this branch yet)"
            )
            + "."
        )
    lines.append(
        "- conveyor's event logs: INFO, JSON lines written to a file per worker process "
        "(a real disk write per line, as in production)."
    )
    if plan.get("pg_durable"):
        lines.append(
            "- Redis and Postgres are private servers started for the run; Postgres is **durable** "
            "(fsync, synchronous_commit, full_page_writes on: every commit waits for the disk)."
        )
    else:
        lines.append(
            "- Redis and Postgres are private servers started for the run; Postgres runs with fsync and "
            "synchronous_commit off (the test suite's settings), the same for every Postgres peer "
            "(`--pg-durable` runs it durable, as in production)."
        )
    for note in results.notes:
        lines.append(f"- {note}")
    if results.failures:
        lines += ["", "## Failures", ""] + [f"- {f}" for f in results.failures]
    lines += ["", "## Machine and versions", ""]
    lines += [f"- {key}: {value}" for key, value in machine().items()]
    lines += [f"- {key}: {value}" for key, value in results.server_versions.items()]
    lines += [f"- {dist} {version}" for dist, version in versions().items()]
    lines += ["", "## Raw figures per repetition", ""]
    raw = []
    for name, runs in results.throughput.items():
        for n, r in enumerate(runs, 1):
            raw.append(
                [
                    f"throughput/{name}",
                    str(n),
                    f"{r.rate:,.0f} jobs/s in {r.seconds:.2f} s",
                    f"enqueue {r.enqueue_rate:,.0f}/s, RSS {'/'.join(str(k // 1024) for k in r.peak_rss_kb)} MiB",
                ]
            )
    for name, runs in results.latency.items():
        for n, r in enumerate(runs, 1):
            raw.append(
                [
                    f"latency/{name}",
                    str(n),
                    f"p50 {r.percentile(50):.2f} / p95 {r.percentile(95):.2f} / p99 {r.percentile(99):.2f} ms",
                    f"mean {r.mean_ms:.2f} ms, {len(r.seconds)} jobs",
                ]
            )
    for kind, runs in results.credit.items():
        for n, r in enumerate(runs, 1):
            raw.append(
                [
                    f"credit/{kind}",
                    str(n),
                    f"{r.rate:,.0f} charges/s in {r.seconds:.2f} s",
                    "verified" if r.verified else "NOT VERIFIED",
                ]
            )
    lines += _table(["measurement", "rep", "figure", "detail"], raw)
    return "\n".join(lines) + "\n"

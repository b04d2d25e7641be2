"""The options of a benchmark run, kept apart so ``conveyor bench`` can offer them without loading the harness."""

from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = (
    "Run conveyor's benchmarks against bare Dramatiq, Celery, dramatiq-postgres and procrastinate "
    "on private Redis and Postgres servers, and write bench/RESULTS.md."
)

DEFAULT_OUTPUT = Path(__file__).with_name("RESULTS.md")

#: The issue's run: 20,000 jobs, 2 processes x 8 threads, 500 latency jobs 10 ms apart, 3 repetitions.
FULL = {"jobs": 20_000, "reps": 3, "latency_jobs": 500, "credit_ops": 5_000}
#: A smoke run of about a minute: proves everything works, judges nothing.
QUICK = {"jobs": 2_000, "reps": 1, "latency_jobs": 100, "credit_ops": 500}


def build_parser(prog: str = "python -m bench", add_help: bool = True) -> argparse.ArgumentParser:
    """The options of a run; ``conveyor bench`` reuses them as its own."""
    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, add_help=add_help)
    p.add_argument("--quick", action="store_true", help="a ~1 minute smoke run (2,000 jobs, 1 repetition)")
    p.add_argument("--jobs", type=int, help=f"jobs per throughput run (default {FULL['jobs']:,})")
    p.add_argument("--reps", type=int, help=f"repetitions of every measurement (default {FULL['reps']})")
    p.add_argument("--latency-jobs", type=int, help=f"timed jobs per latency run (default {FULL['latency_jobs']})")
    p.add_argument("--interval-ms", type=float, default=10.0, help="ms between latency jobs (default 10)")
    p.add_argument("--credit-ops", type=int, help=f"charges per credit run (default {FULL['credit_ops']:,})")
    p.add_argument("--processes", type=int, default=2, help="worker processes per peer (default 2)")
    p.add_argument("--threads", type=int, default=8, help="threads (concurrency) per process (default 8)")
    p.add_argument(
        "--only",
        help="comma-separated peers (conveyor-redis, dramatiq-redis, celery-redis, "
        "conveyor-postgres, dramatiq-postgres, procrastinate) and/or 'credit'; default: all",
    )
    p.add_argument("--skip", default="", help="comma-separated scenarios to leave out: throughput, latency, credit")
    p.add_argument(
        "--pg-durable",
        action="store_true",
        help="run Postgres durable (fsync, synchronous_commit on) instead of the test suite's fast settings",
    )
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help=f"report path (default {DEFAULT_OUTPUT})")
    return p

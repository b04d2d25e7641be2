"""The benchmark harness works: its conveyor-on-Redis part, end to end, on a few hundred jobs (no timing asserted)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from bench.main import main


def test_bench_runs_conveyor_on_redis_and_writes_its_report(clean_env):
    out = Path(tempfile.mkdtemp(prefix="conveyor-bench-smoke-")) / "RESULTS.md"
    code = main(
        [
            "--only",
            "conveyor-redis",
            "--jobs",
            "200",
            "--reps",
            "1",
            "--latency-jobs",
            "20",
            "--processes",
            "2",
            "--threads",
            "4",
            "--output",
            str(out),
        ]
    )
    report = out.read_text()
    assert code == 0, report
    row = next(line for line in report.splitlines() if line.startswith("| conveyor (Redis) | ") and "MiB" not in line)
    rate = float(re.search(r"\| conveyor \(Redis\) \| ([\d,.]+)", row).group(1).replace(",", ""))
    assert rate > 0
    assert "| latency/conveyor-redis | 1 |" in report and "20 jobs" in report
    assert "conveyor on Redis >= 0.85x bare Dramatiq throughput | — |" in report  # the peer was not run
    assert "## Failures" not in report

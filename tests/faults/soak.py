"""``make soak``: the fault suite round after round for ``SOAK_SECONDS``, summed up in ``SOAK_REPORT``.

Each round is a whole ``pytest tests/faults`` run (its own servers, its own
databases); its rows are appended as JSON lines (``FAULT_ROWS``) and the
report sums them per fault and broker after every round, so a soak stopped
halfway still leaves its figures. It stops at the first round that fails
unless ``SOAK_KEEP_GOING=1``; the exit code is that of the worst round.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from tests.support.harness import ROOT


def summarize(rows: list[dict], rounds: int, seconds: float) -> str:
    totals: dict[tuple[str, str], dict] = defaultdict(lambda: defaultdict(float))
    worst: dict[tuple[str, str], float | None] = {}
    for row in rows:
        pair = (row["fault"], row["broker"])
        t = totals[pair]
        t["rounds"] += 1
        for field in ("jobs", "lost", "doubled", "overlapping", "stuck", "reruns"):
            t[field] += row[field]
        t["errors"] += bool(row["error"])
        previous = worst.get(pair, 0.0)
        worst[pair] = None if previous is None or row["recovery"] is None else max(previous, row["recovery"])
    lines = [
        f"# Fault suite soak: {rounds} round(s) in {seconds / 60:.0f} min",
        "",
        "| fault | broker | rounds | jobs | lost | doubled effects | overlapping runs | stuck | "
        "worst time to recover | reruns | unfinished rounds |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for pair, t in totals.items():
        recovery = "never (some round)" if worst[pair] is None else f"{worst[pair]:.1f} s"
        lines.append(
            f"| {pair[0]} | {pair[1]} | {t['rounds']:.0f} | {t['jobs']:.0f} | {t['lost']:.0f} | "
            f"{t['doubled']:.0f} | {t['overlapping']:.0f} | {t['stuck']:.0f} | {recovery} | "
            f"{t['reruns']:.0f} | {t['errors']:.0f} |"
        )
    notes = [f"- {r['fault']} / {r['broker']}: {r['error'] or r['notes']}" for r in rows if r["error"] or r["notes"]]
    return "\n".join(lines + ["", "## Notes", "", *(notes or ["None: every round was clean."]), ""])


def main() -> int:
    seconds = float(os.environ.get("SOAK_SECONDS", "3600"))
    report = Path(os.environ.get("SOAK_REPORT") or Path(tempfile.gettempdir()) / "conveyor-soak-report.md")
    keep_going = os.environ.get("SOAK_KEEP_GOING") == "1"
    workdir = Path(tempfile.mkdtemp(prefix="conveyor-soak-"))
    rows_path = workdir / "rows.jsonl"
    started = time.monotonic()
    rounds, worst = 0, 0
    while rounds == 0 or time.monotonic() - started < seconds:
        rounds += 1
        env = {**os.environ, "FAULT_ROWS": str(rows_path), "FAULT_REPORT": str(workdir / f"round-{rounds}.md")}
        tests = os.environ.get("SOAK_TESTS", "tests/faults").split()  # make soak-hosts: the three-host test alone
        code = subprocess.run([sys.executable, "-m", "pytest", "-q", *tests], cwd=ROOT, env=env).returncode
        worst = max(worst, code)
        rows = [json.loads(line) for line in rows_path.read_text().splitlines()] if rows_path.exists() else []
        report.write_text(summarize(rows, rounds, time.monotonic() - started))
        print(f"soak: round {rounds} exit {code}; summary in {report}", flush=True)
        if code and not keep_going:
            break
    return worst


if __name__ == "__main__":
    sys.exit(main())

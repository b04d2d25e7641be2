"""``make soak``: campaign seeds drawn at random for ``SOAK_SECONDS``, summed up in ``SOAK_REPORT``.

Each round is one ``pytest tests/faults/test_campaign.py`` with four random
seeds (``CAMPAIGN_SEED``) at soak size (tests/faults/campaign.py ``SOAK``)
on both brokers; the runs are appended as JSON lines (``FAULT_ROWS``) and
the report is rewritten after every round, so a soak stopped halfway still
leaves its figures. A failing seed is printed with the command that replays
it, and the soak goes on (it is a search); the exit code is non-zero if any
seed failed. ``SOAK_ALL_FAULTS=1`` adds the fault kinds still pending a fix.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from tests.faults import campaign
from tests.support.harness import ROOT

#: Seeds per pytest run (its servers start once for them); ``SOAK_SEEDS`` overrides.
SEEDS_PER_ROUND = 4


def summarize(runs: list[dict], rounds: int, seconds: float) -> str:
    faults: Counter[str] = Counter()
    anomalies: Counter[str] = Counter()
    for run in runs:
        faults.update(run["faults"])
        anomalies.update(run["anomalies"])
    failing = [r for r in runs if r["anomalies"]]
    lines = [
        f"# Fault campaign soak: {rounds} round(s), {len(runs)} run(s) in {seconds / 60:.0f} min",
        "",
        f"- jobs acknowledged: {sum(r['jobs'] for r in runs)}; unknown outcomes: {sum(r['unknown'] for r in runs)};"
        f" refused: {sum(r['refused'] for r in runs)}; body runs: {sum(r['runs'] for r in runs)}",
        f"- faults applied: {sum(faults.values())} (" + ", ".join(f"{k} {n}" for k, n in sorted(faults.items())) + ")",
        "- anomalies: " + (", ".join(f"{k} {n}" for k, n in sorted(anomalies.items())) or "none"),
        "",
        "## Failing seeds",
        "",
    ]
    for r in failing:
        extra = " CAMPAIGN_ALL_FAULTS=1" if r["all_faults"] else ""
        lines.append(
            f"- `CAMPAIGN_SEED={r['seed']}{extra} CAMPAIGN_JOBS={campaign.SOAK.jobs} "
            f"CAMPAIGN_FAULTS={campaign.SOAK.faults} CAMPAIGN_WINDOW={campaign.SOAK.window:g}` on {r['broker']}: "
            + " | ".join(r["examples"])
        )
    if not failing:
        lines.append("None.")
    return "\n".join(lines + [""])


def main() -> int:
    seconds = float(os.environ.get("SOAK_SECONDS", "3600"))
    report = Path(os.environ.get("SOAK_REPORT") or Path(tempfile.gettempdir()) / "conveyor-soak-report.md")
    workdir = Path(tempfile.mkdtemp(prefix="conveyor-soak-"))
    rows_path = workdir / "rows.jsonl"
    rng = random.SystemRandom()
    started = time.monotonic()
    rounds, worst = 0, 0
    while rounds == 0 or time.monotonic() - started < seconds:
        rounds += 1
        per_round = int(os.environ.get("SOAK_SEEDS", SEEDS_PER_ROUND))
        seeds = [rng.randrange(1_000, 1_000_000) for _ in range(per_round)]
        env = {
            **os.environ,
            "FAULT_ROWS": str(rows_path),
            "FAULT_REPORT": str(workdir / f"round-{rounds}.md"),
            "CAMPAIGN_SEED": ",".join(map(str, seeds)),
            "CAMPAIGN_JOBS": str(campaign.SOAK.jobs),
            "CAMPAIGN_FAULTS": str(campaign.SOAK.faults),
            "CAMPAIGN_WINDOW": str(campaign.SOAK.window),
        }
        if os.environ.get("SOAK_ALL_FAULTS") == "1":
            env["CAMPAIGN_ALL_FAULTS"] = "1"
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:logging", "tests/faults/test_campaign.py"]
        code = subprocess.run(argv, cwd=ROOT, env=env).returncode
        worst = max(worst, code)
        lines = rows_path.read_text().splitlines() if rows_path.exists() else []
        runs = [row["campaign"] for row in map(json.loads, lines) if "campaign" in row]
        report.write_text(summarize(runs, rounds, time.monotonic() - started))
        print(f"soak: round {rounds} (seeds {seeds}) exit {code}; summary in {report}", flush=True)
    return worst


if __name__ == "__main__":
    sys.exit(main())

"""``make soak``: campaign seeds drawn at random for ``SOAK_SECONDS``, summed up in ``SOAK_REPORT``.

Each round is one ``pytest tests/faults/test_campaign.py`` with four random
seeds (``CAMPAIGN_SEED``) at soak size (tests/faults/campaign.py ``SOAK``)
on both brokers; the runs are appended as JSON lines (``FAULT_ROWS``) and
the report is rewritten after every round, so a soak stopped halfway still
leaves its figures. A failing seed is printed with the command that replays
it, and the soak goes on (it is a search); the exit code is non-zero if any
seed failed. ``SOAK_ALL_FAULTS=1`` adds the fault kinds still pending a fix; ``SOAK_TESTS`` repeats
the named listed scenarios instead (their rows summed as before the campaign).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
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


def summarize_rows(rows: list[dict], rounds: int, seconds: float) -> str:
    """The listed scenarios' rows (``SOAK_TESTS``), summed per fault and broker."""
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
        # SOAK_TESTS names listed scenarios to repeat instead of the campaign (make soak-hosts, where it exists).
        tests = os.environ.get("SOAK_TESTS", "tests/faults/test_campaign.py").split()
        # Each round's pytest directory (worker logs, run spools) is kept in the soak's own directory: pytest's
        # default keeps the last three, and other pytest runs on the machine delete a failing seed's logs
        # before anyone reads them (the third soak's were gone within minutes).
        basetemp = workdir / f"round-{rounds}"
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:logging", f"--basetemp={basetemp}", *tests]
        code = subprocess.run(argv, cwd=ROOT, env=env).returncode
        worst = max(worst, code)
        lines = rows_path.read_text().splitlines() if rows_path.exists() else []
        rows = [json.loads(line) for line in lines]
        runs = [row["campaign"] for row in rows if "campaign" in row]
        listed = [row for row in rows if "campaign" not in row]
        text = summarize(runs, rounds, time.monotonic() - started) if runs else ""
        report.write_text(text + (summarize_rows(listed, rounds, time.monotonic() - started) if listed else ""))
        print(f"soak: round {rounds} (seeds {seeds}) exit {code}; summary in {report}", flush=True)
    return worst


if __name__ == "__main__":
    sys.exit(main())

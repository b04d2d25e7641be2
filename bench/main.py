"""``python -m bench``: run every measurement, repetitions interleaved, and write ``bench/RESULTS.md``."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback

from .credit import KINDS as CREDIT_KINDS
from .credit import measure_credit
from .options import FULL, QUICK, build_parser
from .peers import PEERS
from .report import Results, render
from .runner import MeasurementFailed, measure_latency, measure_throughput
from .servers import Servers


def make_plan(args: argparse.Namespace) -> dict:
    base = QUICK if args.quick else FULL
    plan = {key: getattr(args, key) or value for key, value in base.items()}
    selected = [s.strip() for s in (args.only or "").split(",") if s.strip()]
    unknown = sorted(set(selected) - {*PEERS, "credit"})
    if unknown:
        raise SystemExit(f"bench: unknown --only entries {unknown}; known: {', '.join([*PEERS, 'credit'])}")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    plan.update(
        quick=args.quick,
        pg_durable=args.pg_durable,
        interval_ms=args.interval_ms,
        processes=args.processes,
        threads=args.threads,
        peers_considered=[p for p in PEERS if not selected or p in selected],
        credit=(not selected or "credit" in selected) and "credit" not in skip,
        throughput="throughput" not in skip,
        latency="latency" not in skip,
    )
    return plan


def say(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def run(plan: dict, servers: Servers) -> Results:
    """Every selected measurement, ``reps`` times, each repetition running every peer once."""
    results = Results(plan=plan)
    results.server_versions = server_versions(servers)
    peers = []
    for name in plan["peers_considered"]:
        reason = PEERS[name].unavailable()
        if reason:
            results.skipped[name] = reason
            say(f"{name}: {reason}")
        else:
            peers.append(PEERS[name])
    if any(p.name.startswith("conveyor") for p in peers) or plan["credit"]:
        from .peers.conveyor_peer import middleware_names

        results.conveyor_middleware = middleware_names(
            {"broker": "redis", "redis_url": servers.redis_url, "database_url": servers.admin_url}
        )
    common = {"processes": plan["processes"], "threads": plan["threads"]}
    started = time.monotonic()
    for rep in range(1, plan["reps"] + 1):
        if plan["throughput"]:
            for peer in peers:
                _attempt(
                    results,
                    f"throughput/{peer.name} rep {rep}",
                    results.throughput,
                    peer.name,
                    lambda: measure_throughput(peer, servers, jobs=plan["jobs"], tag=f"t{rep}", **common),
                    lambda r: (
                        f"{r.rate:,.0f} jobs/s, enqueue {r.enqueue_rate:,.0f}/s, RSS {max(r.peak_rss_kb) // 1024} MiB"
                    ),
                )
        if plan["latency"]:
            for peer in peers:
                _attempt(
                    results,
                    f"latency/{peer.name} rep {rep}",
                    results.latency,
                    peer.name,
                    lambda: measure_latency(
                        peer,
                        servers,
                        jobs=plan["latency_jobs"],
                        interval=plan["interval_ms"] / 1000,
                        tag=f"l{rep}",
                        **common,
                    ),
                    lambda r: f"p50 {r.percentile(50):.2f} p95 {r.percentile(95):.2f} p99 {r.percentile(99):.2f} ms",
                )
        if plan["credit"]:
            for kind in CREDIT_KINDS:
                _attempt(
                    results,
                    f"credit/{kind} rep {rep}",
                    results.credit,
                    kind,
                    lambda: measure_credit(kind, servers, ops=plan["credit_ops"], tag=f"c{rep}{kind}", **common),
                    lambda r: f"{r.rate:,.0f} charges/s" + ("" if r.verified else " LEDGER NOT VERIFIED"),
                )
        servers.drop_databases()
    results.wall_seconds = time.monotonic() - started
    return results


def _attempt(results: Results, label: str, into: dict, key: str, measure, summary) -> None:
    """One measurement; a failure is recorded and reported, never turned into a figure."""
    say(f"{label} ...")
    try:
        outcome = measure()
    except MeasurementFailed as exc:
        results.failures.append(f"{label}: {exc}".replace("\n", " / ")[:1500])
        say(f"{label} FAILED: {exc}")
        return
    except Exception:
        text = traceback.format_exc()
        results.failures.append(f"{label}: {text.strip().splitlines()[-1]}")
        say(f"{label} FAILED:\n{text}")
        return
    into.setdefault(key, []).append(outcome)
    say(f"{label}: {summary(outcome)}")


def server_versions(servers: Servers) -> dict:
    out = {}
    try:
        out["redis-server"] = (
            subprocess.run(["redis-server", "--version"], capture_output=True, text=True, timeout=10)
            .stdout.split()[2]
            .removeprefix("v=")
        )
    except (OSError, IndexError, subprocess.SubprocessError):
        out["redis-server"] = "unknown"
    with servers.pg.connect() as conn:
        number = conn.info.server_version  # e.g. 150010
        out["postgres"] = f"{number // 10000}.{number % 10000}"
    return out


def main(argv: list[str] | None = None) -> int:
    return run_from_args(build_parser().parse_args(argv))


def run_from_args(args: argparse.Namespace) -> int:
    """Run with parsed options (``conveyor bench`` parses them itself); exit code 1 if anything failed."""
    plan = make_plan(args)
    say(
        f"plan: {plan['jobs']:,} jobs x {plan['reps']} rep(s), peers: {', '.join(plan['peers_considered'])}"
        + (", credit" if plan["credit"] else "")
    )
    with Servers.start(pg_durable=plan["pg_durable"]) as servers:
        say(f"private Redis at {servers.redis_url}, Postgres on port {servers.pg.port}")
        results = run(plan, servers)
    results.load_after = os.getloadavg()
    args.output.write_text(render(results))
    say(f"wrote {args.output} ({results.wall_seconds / 60:.1f} min)")
    return 1 if results.failures else 0

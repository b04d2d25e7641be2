"""Single-call enqueue only: conveyor's ``app.jobs.enqueue`` beside its peer's ``actor.send``, interleaved.

    .venv/bin/python -m bench.enqueue [--jobs 10000] [--rounds 3] [--backend redis,postgres]
        [--pg-durable] [--profile conveyor-redis]

On the harness's private Redis and Postgres (bench/servers.py), each round
times ``--jobs`` one-job calls of conveyor (every job with a dedup key, as
``make bench`` enqueues) and as many ``send`` calls of bare Dramatiq on Redis
(dramatiq-postgres on Postgres, when installed), in alternating order, each
on fresh state after 200 untimed calls. Per round and system: calls/s (wall),
CPU µs per call of this process (client) and of the servers, and conveyor ÷ peer.
``--profile NAME`` then runs NAME's calls once more under cProfile and prints
where the time per call goes.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
import uuid

from .peers.base import Peer, Producer
from .peers.conveyor_peer import ConveyorPostgres, ConveyorRedis
from .peers.dramatiq_peer import DramatiqPostgres, DramatiqRedis
from .servers import Servers

WARMUP = 200

#: (conveyor, its peer) per backend.
PAIRS: dict[str, tuple[Peer, Peer]] = {
    "redis": (ConveyorRedis(), DramatiqRedis()),
    "postgres": (ConveyorPostgres(), DramatiqPostgres()),
}


def timed(
    peer: Peer, servers: Servers, jobs: int, profile: cProfile.Profile | None = None
) -> tuple[float, float, float]:
    """(calls/s wall, client CPU µs per call, server CPU µs per call) of ``jobs`` single sends by ``peer``'s
    producer on fresh state."""
    tag = uuid.uuid4().hex[:8]
    producer: Producer = peer.producer(peer.setup(servers, tag))
    try:
        for i in range(WARMUP):
            producer.send({"i": -1 - i, "t": 0.0})
        payloads = [{"i": i, "t": 0.0} for i in range(jobs)]
        send = producer.send
        server0, cpu0, wall0 = servers.cpu_seconds(), time.process_time(), time.perf_counter()
        if profile is not None:
            profile.enable()
        for payload in payloads:
            send(payload)
        if profile is not None:
            profile.disable()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        server = servers.cpu_seconds() - server0
    finally:
        producer.close()
    return jobs / wall, cpu / jobs * 1e6, server / jobs * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.enqueue", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=10_000, help="timed calls per system per round (default 10,000)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--backend", default="redis,postgres", help="comma-separated: redis, postgres")
    p.add_argument("--pg-durable", action="store_true", help="Postgres with fsync and synchronous_commit on")
    p.add_argument("--profile", help="after the rounds, profile one run of this peer (e.g. conveyor-redis)")
    p.add_argument("--top", type=int, default=30, help="profile lines shown (default 30)")
    args = p.parse_args(argv)
    backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    servers = Servers.start(pg_durable=args.pg_durable)
    try:
        for backend in backends:
            ours, peer = PAIRS[backend]
            why = peer.unavailable() or ours.unavailable()
            if why:
                print(f"{backend}: {why}")
                continue
            ratios: list[float] = []
            cpu_ratios: list[float] = []
            for n in range(args.rounds):
                order = (ours, peer) if n % 2 == 0 else (peer, ours)
                got = {x.name: timed(x, servers, args.jobs) for x in order}
                (r_ours, c_ours, s_ours), (r_peer, c_peer, s_peer) = got[ours.name], got[peer.name]
                ratios.append(r_ours / r_peer)
                cpu_ratios.append(c_ours / c_peer)
                print(
                    f"{backend} round {n + 1}: {ours.name} {r_ours:,.0f}/s, µs CPU/call client {c_ours:,.0f} "
                    f"server {s_ours:,.0f}; {peer.name} {r_peer:,.0f}/s, client {c_peer:,.0f} server {s_peer:,.0f}; "
                    f"rate ratio {ratios[-1]:.2f}×",
                    flush=True,
                )
            if ratios:
                print(
                    f"{backend}: rate ratio median {statistics.median(ratios):.2f}× "
                    f"(range {min(ratios):.2f}-{max(ratios):.2f}); client CPU per call "
                    f"{statistics.median(cpu_ratios):.2f}× the peer's",
                    flush=True,
                )
        if args.profile:
            chosen = next(x for pair in PAIRS.values() for x in pair if x.name == args.profile)
            prof = cProfile.Profile()
            rate, cpu, _ = timed(chosen, servers, args.jobs, profile=prof)
            out = io.StringIO()
            stats = pstats.Stats(prof, stream=out)
            stats.sort_stats("tottime").print_stats(args.top)
            stats.sort_stats("cumulative").print_stats(args.top)
            print(f"profile of {chosen.name}: {args.jobs:,} calls, {cpu:,.0f} µs CPU/call under cProfile")
            print(out.getvalue())
    finally:
        servers.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

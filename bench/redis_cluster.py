"""The Redis broker on a three-primary Redis Cluster against one Redis, same settings (appendfsync always).

    .venv/bin/python -m bench.redis_cluster [--jobs 2000] [--threads 8] [--samples 100]

A private Redis and a private three-primary cluster (tests/support/cluster.py),
each node with ``appendonly yes``, ``appendfsync always``; on each: single
enqueues one after the other (jobs/s), one worker process with ``--threads``
threads draining that backlog of no-op jobs (jobs/s), and enqueue -> start
latency with the worker idle (p50 / p95). One JSON line each. One queue lives
on one slot, so one primary: what a cluster adds is room for more queues.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "critical"


def run(url: str, threads: int, jobs: int, samples: int) -> dict:
    sys.path.insert(0, str(ROOT))
    from bench.pg_quick import Probe
    from conveyor.app import App
    from conveyor.settings import Settings
    from conveyor.tasks.payloads import Payload
    from conveyor.tasks.registry import job
    from conveyor.tasks.worker import ProcessWorker

    probe = Probe()

    class Noop(Payload):
        token: str

    @job("bench.noop", queue=QUEUE, payload=Noop)
    def noop(payload: Noop, ctx) -> None:
        probe.hit(payload.token)

    app = App(Settings(broker="redis", redis_url=url))  # fresh servers: nothing to flush
    worker = ProcessWorker(app, QUEUE, threads=threads)
    try:
        t0 = time.perf_counter()
        for i in range(jobs):
            app.jobs.enqueue("bench.noop", {"token": f"bulk-{i}"})
        enqueue_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        worker.start()
        while True:
            counts = app.broker.queue_counts(QUEUE)
            if counts.waiting + counts.active + counts.delayed == 0:
                break
            time.sleep(0.02)
        drain_s = time.perf_counter() - t0
        latencies = []
        time.sleep(1.0)
        for i in range(samples):
            token = f"lat-{i}"
            probe.event.clear()
            t0 = time.time()
            app.jobs.enqueue("bench.noop", {"token": token})
            if not probe.event.wait(10):
                raise RuntimeError(f"job {token} did not start within 10 s")
            latencies.append(probe.started[token] - t0)
            time.sleep(0.03)
        worker.stop()
        latencies.sort()
        return {
            "jobs": jobs,
            "enqueue_jobs_per_s": round(jobs / enqueue_s),
            "claim_ack_jobs_per_s": round(jobs / drain_s),
            "latency_p50_ms": round(statistics.median(latencies) * 1000, 2),
            "latency_p95_ms": round(latencies[int(len(latencies) * 0.95) - 1] * 1000, 2),
        }
    finally:
        app.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--target", help="(internal) measure this one: redis or cluster")
    parser.add_argument("--url", help="(internal) its URL")
    args = parser.parse_args()

    if args.target is not None:
        result = run(args.url, args.threads, args.jobs, args.samples)
        print(json.dumps({"target": args.target, "threads": args.threads, **result}), flush=True)
        return 0

    sys.path.insert(0, str(ROOT))
    import tempfile

    from tests.support.cluster import RedisCluster
    from tests.support.servers import RedisServer

    for target in ("redis", "cluster"):
        server = (
            RedisServer(tempfile.mkdtemp(prefix="conveyor-bench-redis-"), durable=True)
            if target == "redis"
            else RedisCluster()
        )
        try:
            argv = [sys.executable, "-m", "bench.redis_cluster", "--target", target, "--url", server.url]
            argv += ["--jobs", str(args.jobs), "--threads", str(args.threads), "--samples", str(args.samples)]
            out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=1800)
            lines = [line for line in out.stdout.splitlines() if line.startswith('{"target"')]
            if out.returncode or not lines:
                print(json.dumps({"target": target, "error": out.stderr.strip().splitlines()[-5:]}))
                continue
            print(lines[-1], flush=True)
        finally:
            server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

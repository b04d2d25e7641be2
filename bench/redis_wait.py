"""What ``CONVEYOR_REDIS_WAIT_REPLICAS`` costs: the Redis broker with and without a WAIT for one replica.

    .venv/bin/python -m bench.redis_wait [--jobs 2000] [--threads 8] [--samples 100]

A private primary with one replica and three sentinels (tests/support/sentinel.py),
conveyor on ``redis+sentinel://…/mymaster``; for ``redis_wait_replicas`` 0 and 1,
on a flushed Redis: single enqueues one after the other (jobs/s), one worker
process with ``--threads`` threads draining that backlog of no-op jobs (jobs/s),
and enqueue -> start latency with the worker idle (p50 / p95). One JSON line each.
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


def run(url: str, replicas: int, threads: int, jobs: int, samples: int) -> dict:
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

    app = App(Settings(broker="redis", redis_url=url, redis_wait_replicas=replicas))
    app.broker.client.flushall()
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
    parser.add_argument("--replicas", type=int, help="(internal) measure with this redis_wait_replicas")
    parser.add_argument("--url", help="(internal) the redis+sentinel URL")
    args = parser.parse_args()

    if args.replicas is not None:
        result = run(args.url, args.replicas, args.threads, args.jobs, args.samples)
        print(json.dumps({"redis_wait_replicas": args.replicas, "threads": args.threads, **result}), flush=True)
        return 0

    sys.path.insert(0, str(ROOT))
    from tests.support.sentinel import SentinelGroup

    group = SentinelGroup()
    try:
        for replicas in (0, 1):
            argv = [sys.executable, "-m", "bench.redis_wait", "--replicas", str(replicas), "--url", group.url]
            argv += ["--jobs", str(args.jobs), "--threads", str(args.threads), "--samples", str(args.samples)]
            out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=1800)
            lines = [line for line in out.stdout.splitlines() if line.startswith('{"redis_wait_replicas"')]
            if out.returncode or not lines:
                print(json.dumps({"redis_wait_replicas": replicas, "error": out.stderr.strip().splitlines()[-5:]}))
                continue
            print(lines[-1], flush=True)
    finally:
        group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

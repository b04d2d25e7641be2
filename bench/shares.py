"""Where a conveyor worker's CPU goes, by guarantee: py-spy samples one worker process during a drain.

    .venv/bin/python -m bench.shares [--backend redis|postgres] [--jobs 20000] [--seconds 8]

Enqueues ``--jobs`` no-op jobs, drains them with the bench's worker processes
(``--processes`` x ``--threads``, full middleware, as ``python -m bench``
runs conveyor), and while they run, ``py-spy record --format raw`` samples
the first worker process (GIL-holding threads only, so idle waits are not
counted). Each sample is given to the deepest conveyor module on its stack
(:data:`OWNERS`): what a library does on conveyor's behalf counts to the
module that called it, so a Redis call made for the attempt history counts
to the history. Prints each owner's share of the samples. Needs py-spy (the
``bench`` extra) and ptrace rights (root, or ``kernel.yama.ptrace_scope=0``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from .peers import get_peer
from .probe import Probe
from .runner import Workers, drain_timeout, running, wait_for_jobs
from .servers import Servers

#: (path fragment, owner), first match wins, tried on each frame from the leaf up.
OWNERS: tuple[tuple[str, str], ...] = (
    ("bench/probe.py", "the job's own body"),
    ("conveyor/logs.py", "event log lines"),
    ("conveyor/middleware/metrics.py", "Prometheus metrics"),
    ("conveyor/middleware/rollup.py", "charts' rollup"),
    ("conveyor/brokers/rollup/", "charts' rollup"),
    ("conveyor/middleware/fleet.py", "worker registry and attempt history"),
    ("conveyor/brokers/fleet/", "worker registry and attempt history"),
    ("conveyor/middleware/cancel.py", "cancel checks"),
    ("conveyor/middleware/retries.py", "retries"),
    ("conveyor/middleware/time_limit.py", "time limit"),
    ("conveyor/middleware/", "other middleware"),
    ("conveyor/tasks/payloads.py", "payload validation"),
    ("conveyor/tasks/", "job dispatch (context, payload, handle)"),
    ("conveyor/brokers/", "broker: fetch, start (fence, attempt), ack"),
    ("conveyor/", "conveyor, other"),
    ("dramatiq/", "Dramatiq's worker"),
)


def owner_of(stack: list[str]) -> str:
    for frame in reversed(stack):
        for fragment, owner in OWNERS:
            if fragment in frame:
                return owner
    return "Python runtime, threads, other libraries"


def shares(raw: str) -> Counter:
    counts: Counter = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        counts[owner_of(stack.split(";"))] += int(count)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("redis", "postgres"), default="redis")
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rate", type=int, default=250)
    parser.add_argument("--raw", type=Path, help="keep py-spy's samples (collapsed stacks) in this file")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    peer = get_peer(f"conveyor-{args.backend}")
    with Servers.start() as servers, tempfile.TemporaryDirectory(prefix="conveyor-shares-") as tmp:
        env = peer.setup(servers, "shares")
        producer = peer.producer(env)
        try:
            producer.enqueue_bulk([{"i": i, "t": 0.0} for i in range(args.jobs)])
        finally:
            producer.close()
        probe = Probe.create(args.processes)
        out = Path(tmp) / "samples.txt"
        with running(Workers(peer, env, args.processes, args.threads, probe, servers.run_dir)) as workers:
            workers.release()
            time.sleep(0.5)
            pid = workers.processes[0].pid
            spy_run = subprocess.run(
                [spy, "record", "--pid", str(pid), "--format", "raw", "--gil", "--rate", str(args.rate)]
                + ["--duration", str(int(args.seconds)), "--output", str(out), "--nonblocking"],
                capture_output=True,
                text=True,
                check=False,
            )
            done = probe.total()
            wait_for_jobs(probe, args.jobs, workers, drain_timeout(args.jobs))
        if spy_run.returncode != 0 or not out.exists():
            sys.exit(f"py-spy failed: {spy_run.stderr.strip()[-500:]}")
        counts = shares(out.read_text())
        if args.raw:
            shutil.copy(out, args.raw)
    total = sum(counts.values()) or 1
    print(f"conveyor-{args.backend}: {total} samples of one worker process while {done:,} jobs had run")
    print("| where the worker's CPU goes | share |\n|---|---|")
    for owner, count in counts.most_common():
        print(f"| {owner} | {100 * count / total:.1f} % |")


if __name__ == "__main__":
    main()

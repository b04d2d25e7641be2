"""Running one measurement of one peer: worker processes, the go signal, the clock.

Throughput: N jobs are enqueued first (timed: that is the bulk enqueue
rate), then ``processes`` worker processes boot, report ready, and are
released together; the rate is N over the time from the first job's start
to the last job's, as the jobs themselves stamp it (see :mod:`bench.probe`).
Worker boot is therefore outside the figure for every peer alike.

Latency: workers boot, run a few warm-up jobs and sit idle; then one job
is enqueued every ``interval`` seconds and each job records the time from
just before its enqueue call to the start of its body.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import procstat
from .peers import Peer, get_peer
from .probe import Probe

#: How long a worker process may take to boot before the run is abandoned.
BOOT_TIMEOUT = 90.0

#: How often the parent looks at the probe. The figures come from the jobs'
#: own time stamps, so this only bounds how soon the parent notices the end.
POLL_SECONDS = 0.01

#: Warm-up jobs before a latency run, so every consumer has connected.
WARMUP_JOBS = 20

#: Seconds the workers sit idle after the warm-up, before the timed jobs.
IDLE_SECONDS = 1.0

_spawn = multiprocessing.get_context("spawn")


class MeasurementFailed(RuntimeError):
    """A run did not finish (a worker died or jobs went missing); the message says what was seen."""


@dataclass
class Throughput:
    jobs: int
    seconds: float  # first job start -> last job start
    enqueue_seconds: float
    peak_rss_kb: list[int]  # per worker process
    worker_cpu_s: float  # all worker processes, from go to the end
    server_cpu_s: float  # Redis or Postgres, from go to the end

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0

    @property
    def enqueue_rate(self) -> float:
        return self.jobs / self.enqueue_seconds if self.enqueue_seconds > 0 else 0.0


@dataclass
class Latency:
    seconds: list[float] = field(default_factory=list)

    def percentile(self, p: float) -> float:
        """The p-th percentile in milliseconds (nearest rank)."""
        data = sorted(self.seconds)
        if not data:
            return float("nan")
        rank = max(0, min(len(data) - 1, int(round(p / 100 * len(data) + 0.5)) - 1))
        return data[rank] * 1000

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.seconds) * 1000 if self.seconds else float("nan")


def child_main(peer_name: str, env: dict, threads: int, probe: Probe, slot: int, ready, go, log_path: str) -> None:
    """Entry point of a worker process (spawned, so it starts from a clean interpreter)."""
    _redirect_output(log_path)
    from . import probe as probe_module

    probe_module.attach(probe, slot)
    get_peer(peer_name).serve(env, threads, ready, go)


def _redirect_output(path: str) -> None:
    """Send the process's stdout and stderr (banners, tracebacks) to its log file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


class Workers:
    """``processes`` worker processes of one peer, started and readied together."""

    def __init__(
        self,
        peer: Peer,
        env: dict,
        processes: int,
        threads: int,
        probe: Probe,
        run_dir: Path,
        target=child_main,
        target_name: str | None = None,
    ) -> None:
        self.go = _spawn.Event()
        self.ready = [_spawn.Event() for _ in range(processes)]
        self.logs = [run_dir / f"{peer.name}-worker-{slot}-{time.monotonic_ns()}.log" for slot in range(processes)]
        self.processes = [
            _spawn.Process(
                target=target,
                name=f"bench-{peer.name}-{slot}",
                daemon=True,
                args=(
                    target_name or peer.name,
                    env,
                    threads,
                    probe,
                    slot,
                    self.ready[slot],
                    self.go,
                    str(self.logs[slot]),
                ),
            )
            for slot in range(processes)
        ]

    def start(self) -> None:
        for process in self.processes:
            process.start()
        deadline = time.monotonic() + BOOT_TIMEOUT
        for process, ready in zip(self.processes, self.ready):
            while not ready.wait(0.1):
                self.check_alive()
                if time.monotonic() > deadline:
                    raise MeasurementFailed(
                        f"worker {process.name} not ready within {BOOT_TIMEOUT:.0f}s{self._log_tail()}"
                    )

    def release(self) -> None:
        self.go.set()

    def check_alive(self) -> None:
        for process in self.processes:
            if not process.is_alive():
                raise MeasurementFailed(f"worker {process.name} exited with code {process.exitcode}{self._log_tail()}")

    def peak_rss_kb(self) -> list[int]:
        return [procstat.peak_rss_kb(p.pid) for p in self.processes]

    def cpu_seconds(self) -> float:
        return sum(procstat.tree_cpu_seconds(p.pid) for p in self.processes)

    def kill(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes:
            if process.pid is not None:
                process.join(10)

    def _log_tail(self) -> str:
        tails = []
        for path in self.logs:
            try:
                text = path.read_text(errors="replace").strip().splitlines()[-15:]
            except OSError:
                continue
            if text:
                tails.append(f"\n--- {path.name}:\n" + "\n".join(text))
        return "".join(tails)


@contextmanager
def running(workers: Workers):
    try:
        workers.start()
        yield workers
    finally:
        workers.kill()


def wait_for_jobs(probe: Probe, count: int, workers: Workers, timeout: float) -> None:
    """Return once ``count`` jobs have run; fail if a worker died or time ran out."""
    deadline = time.monotonic() + timeout
    while probe.total() < count:
        if time.monotonic() > deadline:
            raise MeasurementFailed(
                f"only {probe.total()} of {count} jobs ran within {timeout:.0f}s{workers._log_tail()}"
            )
        workers.check_alive()
        time.sleep(POLL_SECONDS)


def drain_timeout(jobs: int) -> float:
    """Generous: 50 jobs/s would still finish. A slower peer is reported as failed, not waited on forever."""
    return 60 + jobs / 50


def measure_throughput(peer: Peer, servers, *, jobs: int, processes: int, threads: int, tag: str) -> Throughput:
    """Enqueue ``jobs`` no-op jobs, then drain them with ``processes`` x ``threads``."""
    env = peer.setup(servers, tag)
    payloads = [{"i": i, "t": 0.0} for i in range(jobs)]
    producer = peer.producer(env)
    try:
        started = time.perf_counter()
        producer.enqueue_bulk(payloads)
        enqueue_seconds = time.perf_counter() - started
    finally:
        producer.close()
    probe = Probe.create(processes)
    with running(Workers(peer, env, processes, threads, probe, servers.run_dir)) as workers:
        cpu_before, server_before = workers.cpu_seconds(), servers.cpu_seconds()
        workers.release()
        wait_for_jobs(probe, jobs, workers, drain_timeout(jobs))
        return Throughput(
            jobs=jobs,
            seconds=probe.span(),
            enqueue_seconds=enqueue_seconds,
            peak_rss_kb=workers.peak_rss_kb(),
            worker_cpu_s=workers.cpu_seconds() - cpu_before,
            server_cpu_s=servers.cpu_seconds() - server_before,
        )


def measure_latency(
    peer: Peer, servers, *, jobs: int, interval: float, processes: int, threads: int, tag: str
) -> Latency:
    """Enqueue one job every ``interval`` seconds to idle workers; return each job's enqueue-to-start time."""
    env = peer.setup(servers, tag)
    probe = Probe.create(processes, latency_slots=jobs)
    producer = peer.producer(env)
    try:
        with running(Workers(peer, env, processes, threads, probe, servers.run_dir)) as workers:
            workers.release()
            # Warm-up jobs carry indexes past the timed ones: they are counted, not timed.
            for k in range(WARMUP_JOBS):
                producer.send({"i": jobs + k, "t": 0.0})
            wait_for_jobs(probe, WARMUP_JOBS, workers, BOOT_TIMEOUT)
            time.sleep(IDLE_SECONDS)
            start = time.perf_counter()
            for i in range(jobs):
                pause = start + i * interval - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                producer.send({"i": i, "t": time.time()})
            wait_for_jobs(probe, WARMUP_JOBS + jobs, workers, 60 + jobs * interval)
            return Latency(probe.latencies(jobs))
    finally:
        producer.close()

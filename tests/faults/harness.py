"""One fault test's world: settings with short leases, worker supervisors, kills on record.

Workers are real ``conveyor worker`` supervisors (subprocesses), started with
an optional command prefix (``ip netns exec NS`` to put them on another
network, nothing else changes) and extra environment (libfaketime to move
their clock). Every SIGKILL the harness sends is written down with its time,
so the checker knows when a killed run ended.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import time
from pathlib import Path

from conveyor.app import App
from conveyor.settings import Settings
from tests.faults.jobs import WORK_QUEUES
from tests.support.harness import WorkerProcess, make_settings
from tests.support.waiting import wait_for

#: Seconds without a heartbeat before a worker's jobs are recovered, on both brokers
#: (Redis: heartbeat_timeout; Postgres: the lease). Longer than the slowest workload job,
#: so that a run is over before its job can be handed to someone else.
LEASE = 3.0

#: Seconds between recovery passes.
RECOVERY = 0.5

#: Seconds a key deduplicates: short, so the checker can see every key free again.
DEDUP_TTL = 4.0

#: Settings of every fault test: shortened through settings, never by sleeping longer.
FAULT_SETTINGS = {
    "heartbeat_timeout": LEASE,
    "maintenance_interval": RECOVERY,
    "pg_lease_seconds": LEASE,
    "pg_recovery_seconds": RECOVERY,
    "pg_poll_seconds": 0.5,
    "shutdown_timeout": 15,
    "dedup_ttl": DEDUP_TTL,
    "imports": "tests.faults.jobs",
}

#: The libfaketime preload (Debian's libfaketime package).
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"

#: How long a worker supervisor may take to have all its processes running (a loaded CI machine).
READY_TIMEOUT = 90.0

#: The exit status of ``conveyor worker`` that stopped at its start with an error message (a server away).
REFUSED_TO_START = 2


def fault_settings(broker: str, redis_url: str | None, database_url: str, **overrides) -> Settings:
    return make_settings(broker, redis_url, database_url, **{**FAULT_SETTINGS, **overrides})


def utc(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


class Supervisor(WorkerProcess):
    """``conveyor worker`` for the workload's queues, as a subprocess (started by tests.support.harness)."""

    def __init__(
        self,
        cluster: "Cluster",
        name: str,
        queues: tuple[str, ...],
        processes: int,
        prefix: list[str],
        settings: Settings,
        env: dict[str, str],
    ) -> None:
        self.name = name
        self.queues = queues
        self.expected = len(queues) * processes
        extra = {
            "FAULT_SPOOL": str(cluster.spool),
            "FAULT_HOST": name,
            "CONVEYOR_METRICS_PORT": "0",
            **cluster.env,
            **env,
        }
        super().__init__(
            settings, ",".join(queues), processes, log=cluster.logs / f"worker-{name}.log", prefix=prefix, **extra
        )

    def wait_ready(self) -> None:
        """Wait for all its processes to run. A supervisor that refused to start because a server was away
        (``conveyor: error: … is unavailable``, exit 2: a group started while another fault has Postgres
        restarting, and slower to accept connections on a loaded machine) is started again, as its process
        manager would; any other exit before it was ready fails here, with its log's last line."""

        def ready() -> bool:
            code = self.proc.poll()
            if code is None:
                return len(self.child_pids()) >= self.expected
            last = self.last_line()
            if code == REFUSED_TO_START and not self._stop_sent and "unavailable" in last:
                self.start_again()
                return False
            raise AssertionError(f"worker group {self.name} exited {code} before it was ready: {last[:300]}")

        wait_for(ready, timeout=READY_TIMEOUT, interval=0.2, message=f"{self.expected} worker processes of {self.name}")

    def last_line(self) -> str:
        lines = self.log.read_text(errors="replace").strip().splitlines() if self.log else []
        return lines[-1] if lines else ""

    def terminate(self, timeout: float = 60) -> int | None:
        """SIGTERM (drain), then SIGKILL of the whole group if it did not exit in time; returns its exit code."""
        try:
            self.send_stop()
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self._kill_leftovers()
            if not self._log_file.closed:
                self._log_file.close()

    def _kill_leftovers(self) -> None:
        # Worker processes whose supervisor was killed would live on: they are ours, end them.
        for pid in self.child_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Cluster:
    """The app (producer side), the supervisors, and the record of every kill."""

    def __init__(self, settings: Settings, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.settings = settings
        #: Environment for every worker: settings the test overrode that tests.support.harness.env_for does not pass.
        self.env = dict(env or {})
        self.logs = workdir / "logs"
        self.spool = workdir / "spool"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.spool.mkdir(parents=True, exist_ok=True)
        self.app = App(settings)
        self.supervisors: list[Supervisor] = []
        #: pid -> UNIX time of the SIGKILL the harness sent it.
        self.kills: dict[int, float] = {}

    def start_workers(
        self,
        name: str,
        *,
        queues: tuple[str, ...] = WORK_QUEUES,
        processes: int = 1,
        prefix: list[str] | None = None,
        settings: Settings | None = None,
        wait: bool = True,
        **env: str,
    ) -> Supervisor:
        supervisor = Supervisor(
            self, f"{name}{len(self.supervisors)}", queues, processes, prefix or [], settings or self.settings, env
        )
        self.supervisors.append(supervisor)
        if wait:
            supervisor.wait_ready()
        return supervisor

    def kill(self, pid: int) -> float:
        """SIGKILL one worker process; returns (and records) when."""
        at = time.time()
        os.kill(pid, signal.SIGKILL)
        self.kills.setdefault(pid, at)  # a second SIGKILL to a dead, unreaped process changes nothing
        return self.kills[pid]

    def close(self) -> None:
        try:
            for supervisor in self.supervisors:  # all drain at once
                supervisor.send_stop()
            for supervisor in self.supervisors:
                supervisor.terminate(timeout=30)
        finally:
            self.app.close()


def open_runs(cluster: Cluster, token_prefix: str, *, effect: bool = False) -> list[tuple[str, int, str]]:
    """(token, pid, job id) of runs that started and have not ended, optionally only those past their effect."""
    import psycopg

    query = (
        "SELECT token, pid, job_id FROM fault_runs WHERE ended_at IS NULL AND token LIKE %s"
        + (" AND effect_at IS NOT NULL" if effect else "")
        + " ORDER BY started_at"
    )
    with psycopg.connect(cluster.settings.database_url, autocommit=True, connect_timeout=10) as conn:
        return [tuple(r) for r in conn.execute(query, (token_prefix + "%",)).fetchall()]


def kill_holders(cluster: Cluster, tokens: set[str], timeout: float = 60) -> float:
    """Once every job of ``tokens`` is past its effect and waiting for its ack, SIGKILL their processes.

    All at once: killing one process while another holder in it has not reached its effect yet
    would make that one a mid-job kill. Returns the time of the last kill.
    """

    def holding() -> dict[str, int]:
        return {token: pid for token, pid, _ in open_runs(cluster, "", effect=True) if token in tokens}

    def all_holding() -> dict[str, int] | None:
        now = holding()
        return now if set(now) == tokens else None

    held = wait_for(
        all_holding, timeout=timeout, interval=0.05, message=f"jobs {sorted(tokens)} to hold after their effect"
    )
    last = time.time()
    for pid in sorted(set(held.values())):
        last = cluster.kill(pid)
    return last

"""One campaign run: a world, a seeded workload, the nemesis's schedule, the history, the verdict.

The world: private durable servers that listen on loopback and on a veth
address (a network namespace is the far worker host), Postgres started
under libfaketime reading a clock file the nemesis rewrites (a server
clock step; redis-server cannot run under libfaketime); a reply-dropping
proxy between the producer and the broker; two worker supervisors (near,
and far in the namespace) and, for a window each, a worker group whose
clock is off and steps, and an old worker that lacks the v2 job module.

The workload (drawn from the seed as well): keyed and unkeyed jobs, single
and batch enqueues, duplicates of keys, delays, retries, slow bodies,
final failures with hooks (slow ones when the schedule may kill in a hook),
charges through the real ledger (``credit.consume`` and fault jobs that
charge), v2 jobs, fan-out bodies that enqueue a batch of keyed children,
and every successful body writes a row to the effect log. The producer retries a
batch refused with "nothing was enqueued", and after an unknown outcome
only its keyed jobs (what the docs tell a caller to do).

The control features (issues 18, 21), drawn from the seed too (their own
random streams, so the rest of a seed's workload is as before): grouped
jobs of mixed priorities on a queue with a per-group cap (:func:`grouped`),
and cancels of a subset of the jobs at drawn times after their enqueue
was acknowledged, some while they wait, some while they run, some after
they ended (:class:`Canceller`); each cancel's answer and its times go into
the history.

Event waits (issue 21), drawn from the seed too (:func:`waiters`): jobs that
``ctx.wait_for`` an event of their own, and a :class:`Signaller` that signals
it before the wait, during it, after its timeout, twice, or never.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

import psycopg
import redis as redis_lib

from conveyor.app import App
from conveyor.errors import ConveyorError, EnqueueOutcomeUnknown
from conveyor.ledger import credits
from tests.faults import history as hist
from tests.faults import nemesis
from tests.faults.harness import DEDUP_TTL, FAKETIME_LIB, LEASE, RECOVERY, Cluster, fault_settings, utc
from tests.faults.jobs import WORK_QUEUES, child, uptime
from tests.faults.jobs_extra import EXTRA_QUEUES, GROUP_CAP, GROUP_QUEUE, LIMITS_QUEUE, POLL_QUEUE
from tests.faults.netns import NetworkNamespace
from tests.faults.proxy import ReplyDroppingProxy
from tests.support.cluster import RedisCluster
from tests.support.harness import ROOT, env_for
from tests.support.servers import PostgresServer, RedisServer

#: The job modules of a current worker and of the producer; an old worker has only the first.
IMPORTS_NEW = "tests.faults.jobs,tests.faults.jobs_v2,tests.faults.jobs_extra"
IMPORTS_OLD = "tests.faults.jobs"

#: Seconds of quiet after the last fault healed for every acknowledged job to end (lease, recovery,
#: retries' backoff, a loaded CI machine).
QUIET = LEASE + RECOVERY + 40.0

#: Seconds past the quiet period the campaign still waits while the backlog shrinks, and the seconds
#: without a job ending after which a backlog counts as stalled (stuck) rather than slow.
BACKLOG_GRACE = 120.0
BACKLOG_STALL = 10.0

#: Seconds libfaketime keeps a clock file's value before reading it again (worker groups whose clock is off).
CLOCK_CACHE = 1

#: Seconds, at most, for a step of an uncached clock (the Postgres server's) to reach every process it moves.
UNCACHED_LAG = 0.2

#: The queue poison is put on (paused for the moment it takes).
POISON_QUEUE = "nudge"

#: Seconds a worker group that joined for a window (old, skewed) gets to drain before it is SIGKILLed.
DRAIN_SECONDS = 10.0

#: Seconds a skewed worker runs after its clock stepped, before it leaves.
WORKER_STEP_SECONDS = 2.0

#: Seconds a worker group that joins for a window may take to start (a loaded CI machine).
READY_SECONDS = 30.0

#: The Redis client timeout of the campaign (producer and workers): short, so a lost reply shows soon.
REDIS_TIMEOUT = 2.0

#: The campaign's third broker: conveyor's redis broker on a private Redis Cluster of three primaries with a
#: replica each (``redis+cluster://``), with CONVEYOR_REDIS_WAIT_REPLICAS=1; its own kind is failover.
CLUSTER = "redis-cluster"

#: Seconds before a primary's SIGKILL within which a write it acknowledged without WAIT (an ack, a signal,
#: a cancel) may not have reached its replica yet: the checker does not require such a signal to arrive.
FAILOVER_LAG = 1.0

#: Seconds each WAIT for the slot's replica may take on the cluster (a loaded CI machine).
CLUSTER_WAIT_TIMEOUT = 2.0


@dataclasses.dataclass(frozen=True)
class Size:
    """How big a run is: jobs, faults, and the window the faults are drawn over."""

    jobs: int
    faults: int
    window: float


CI = Size(jobs=240, faults=5, window=14.0)
SOAK = Size(jobs=1500, faults=14, window=45.0)


class Clock:
    """A libfaketime clock file: ``LD_PRELOAD`` + ``FAKETIME_TIMESTAMP_FILE`` for the processes it moves.

    ``cached``: each process keeps the file's value for :data:`CLOCK_CACHE` seconds (cheap; a worker
    group's). Uncached, every clock call reads the file (``FAKETIME_NO_CACHE=1``): the Postgres server's,
    whose backends (one per connection, each with its own cache, refreshed only when that backend next
    asks the time after its cache ran out) otherwise saw a step late and unevenly, so heartbeats were
    stamped on the old clock after recovery had read the new one.
    """

    def __init__(self, directory: Path, name: str, *, cached: bool = True) -> None:
        self.path = directory / f"{name}.faketime"
        self.cached = cached
        #: Seconds by which every process it moves has seen a step.
        self.lag = CLOCK_CACHE if cached else UNCACHED_LAG
        self.offset = 0.0
        self.set(0)
        self.path.chmod(0o644)

    def set(self, seconds: float) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{seconds:+.0f}\n")
        tmp.chmod(0o644)
        os.replace(tmp, self.path)
        self.offset = seconds

    @property
    def env(self) -> dict[str, str]:
        cache = {"FAKETIME_CACHE_DURATION": str(CLOCK_CACHE)} if self.cached else {"FAKETIME_NO_CACHE": "1"}
        return {"LD_PRELOAD": FAKETIME_LIB, "FAKETIME_TIMESTAMP_FILE": str(self.path), **cache}


class Servers:
    """The campaign's durable servers, on loopback and the namespace's veth address, clocks steppable."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="conveyor-campaign-"))
        self.dir.chmod(0o755)
        self.namespace = NetworkNamespace()
        self.closers: list = [self.namespace.close]
        try:
            self.pg_clock = Clock(self.dir, "postgres", cached=False)
            self.worker_clock = Clock(self.dir, "far")
            address = self.namespace.host_address
            pg_env = self.pg_clock.env

            class ClockedPostgres(PostgresServer):
                env = pg_env

            self.pg = ClockedPostgres(
                tempfile.mkdtemp(prefix="conveyor-campaign-pg-"),
                settings={**PostgresServer.DURABLE, "listen_addresses": f"127.0.0.1,{address}"},
            )
            self.closers.append(self.pg.close)
            self.pg.trust(f"{self.namespace.ns_address}/32")
            # Redis is not clocked: redis-server under libfaketime dies at start (jemalloc's first
            # clock_gettime recurses into libfaketime's initialisation).
            self.redis = RedisServer(
                tempfile.mkdtemp(prefix="conveyor-campaign-redis-"), durable=True, bind=("127.0.0.1", address)
            )
            self.closers.append(self.redis.close)
        except BaseException:
            self.close()
            raise
        self._cluster: RedisCluster | None = None

    @property
    def cluster(self) -> RedisCluster:
        """Three primaries with a replica each (tests/support/cluster.py), started when a run first needs it."""
        if self._cluster is None:
            self._cluster = RedisCluster(replicas=1)
            self.closers.append(self._cluster.close)
        return self._cluster

    def close(self) -> None:
        for close in reversed(self.closers):
            try:
                close()
            except Exception:  # noqa: BLE001 - close the rest
                pass
        self.closers.clear()


@dataclasses.dataclass
class Item:
    """One planned request and its record."""

    request: hist.Request
    payload: dict
    delay: float | None = None
    #: The index of the request whose key this one repeats.
    duplicate: bool = False
    #: Seconds after its enqueue was acknowledged that the workload cancels it (None: it does not).
    cancel_after: float | None = None
    #: UNIX seconds its enqueue was acknowledged (the producer's answer).
    acked_at: float = 0.0
    #: A waiter's signals: (seconds after its enqueue's answer, or None: before its enqueue; the data).
    signal_plan: list[tuple[float | None, str]] = dataclasses.field(default_factory=list)

    def body(self) -> dict:
        body = {"job": self.request.job, "payload": self.payload, "key": self.request.key, "delay": self.delay}
        if self.request.priority:
            body["priority"] = self.request.priority
        if self.request.group is not None:
            body["group"] = self.request.group
        return body


def plan(seed: int, n: int, price: Decimal, *, slow_hooks: bool) -> list[Item]:
    """``n`` jobs of every kind (and a duplicate request for a quarter of the keyed ones), from the seed.

    With ``slow_hooks`` final-failure hooks take 0.5-1.5 s (for the kill-hook fault to land in); without,
    they are one insert, so that kills meant for bodies seldom land in a hook.
    """
    rng = random.Random(f"workload:{seed}")
    items: list[Item] = []
    for i in range(n):
        token = f"c{seed}-{i}"
        queue = WORK_QUEUES[i % len(WORK_QUEUES)]
        kind = rng.choices(
            ["quick", "slow", "fail_once", "permanent", "charge", "consume", "delayed", "v2", "fanout"],
            weights=[28, 14, 12, 6, 12, 8, 12, 8, 4],
        )[0]
        payload: dict = {"token": token, "effect": True}
        req = hist.Request(token=token, job=f"fault.work.{queue}")
        item = Item(req, payload)
        if kind in ("quick", "v2"):
            payload["sleep"] = round(rng.uniform(0.01, 0.1), 3)
            if kind == "v2":
                req.job = f"fault.v2.{queue}"
        elif kind == "slow":
            payload["sleep"] = round(rng.uniform(1.0, 2.0), 3)
        elif kind == "fail_once":
            payload.update(fail_times=1, sleep=0.02)
        elif kind == "permanent":
            hook_sleep = round(rng.uniform(0.5, 1.5), 2)
            payload.update(permanent=True, hook_sleep=hook_sleep if slow_hooks else 0)
            req.expect = "failed"
        elif kind == "fanout":
            payload.update(children=rng.randint(3, 8), sleep=0.05)
        elif kind == "delayed":
            payload["sleep"] = 0.02
            item.delay = round(rng.uniform(0.3, 3.0), 2)
        else:
            user, task, message = f"c{seed}-u{i % 7}", f"c{seed}-t{i}", f"m{i}"
            tokens = rng.randint(1, 5000)
            charge = {"user_id": user, "task_id": task, "message_id": message, "total_tokens": tokens}
            req.charge = (credits.consume_reference(task, message), user, credits.cost(tokens, price))
            req.key = f"credit:{task}:{message}"
            if kind == "consume":
                req.job, req.logged, item.payload = "credit.consume", False, charge
                req.token = req.key
            else:
                req.job = "fault.work.critical"
                payload.update(charge, sleep=round(rng.uniform(0.01, 0.3), 3), fail_times=int(rng.random() < 0.3))
        if req.key is None and rng.random() < 0.3:
            req.key = f"job:{token}"
        items.append(item)
    for item in list(items):
        if item.request.key and rng.random() < 0.25:
            # The same request again (same token and key): it must get the first job back.
            at = min(len(items), items.index(item) + rng.randint(1, 6))
            items.insert(at, dataclasses.replace(item, duplicate=True))
    grouped(seed, n, items)
    cancels(seed, items)
    waiters(seed, n, items)
    return items


#: The groups of the grouped jobs and their weights: one with a backlog well past the cap, a few small.
GROUPS = {"g0": 6, "g1": 2, "g2": 1, "g3": 1}


def grouped(seed: int, n: int, items: list[Item]) -> None:
    """About n/8 jobs on the capped queue (GROUP_QUEUE), in drawn groups and priorities, added to ``items``
    (a producer of their own sends them: a group's backlog stands in line behind its cap, the others pass it)."""
    rng = random.Random(f"groups:{seed}")
    for i in range(max(4, n // 8)):
        token = f"c{seed}-g{i}"
        group = rng.choices(list(GROUPS), weights=list(GROUPS.values()))[0]
        req = hist.Request(token=token, job="fault.grouped", group=group, priority=rng.choice([0, 0, 0, 2, 5, 9]))
        payload = {"token": token, "effect": True, "sleep": round(rng.uniform(0.2, 0.9), 3), "check_held": True}
        if rng.random() < 0.15:
            payload["fail_times"] = 1
        items.append(Item(req, payload))


def cancels(seed: int, items: list[Item]) -> None:
    """Draw the jobs the workload cancels, and when: right after the enqueue's answer (mostly still
    waiting or delayed, or held behind its group's cap), a little later (a slow body running), or
    seconds later (most have ended). Charges and fan-outs are left alone (their ledger and children)."""
    rng = random.Random(f"cancels:{seed}")
    for item in items:
        req = item.request
        # A delayed job, or a grouped one (its group's backlog waits behind the cap), is likelier still waiting.
        waits = bool(item.delay or req.group)
        if item.duplicate or req.charge or item.payload.get("children") or rng.random() >= (0.25 if waits else 0.07):
            continue
        when = rng.choice(
            ["waiting", "waiting", "running", "ended"] if waits else ["waiting", "running", "running", "ended"]
        )
        if when == "waiting":
            item.cancel_after = 0.0
        elif when == "running":
            item.cancel_after = round(rng.uniform(0.15, 1.0), 2)
        else:
            item.cancel_after = round(rng.uniform(4.0, 7.0), 2)


def waiters(seed: int, n: int, items: list[Item]) -> None:
    """About n/20 keyed jobs that ``ctx.wait_for`` an event of their own for 2-5 s, added to ``items`` (after the
    cancels are drawn: a waiter is never cancelled), each with its signals: one sent before its enqueue,
    one during its wait, one after its timeout, two during it (different data: the first kept wins), or
    none (the timeout resumes it with None). A producer of their own sends them one at a time."""
    rng = random.Random(f"waits:{seed}")
    for i in range(max(4, n // 20)):
        token = f"c{seed}-w{i}"
        queue = WORK_QUEUES[i % len(WORK_QUEUES)]
        timeout = round(rng.uniform(2.0, 5.0), 2)
        req = hist.Request(token=token, job=f"fault.work.{queue}", event=f"ev-{token}", wait_timeout=timeout)
        req.key = f"wait:{token}"  # keyed: an enqueue of unknown outcome is sent again (its signals need it)
        payload = {"token": token, "effect": True, "sleep": 0.02, "event": req.event, "wait_timeout": timeout}
        when = rng.choices(["before", "during", "after", "twice", "never"], weights=[2, 4, 2, 2, 2])[0]
        during = round(rng.uniform(0.3, timeout - 0.8), 2)
        plan_: list[tuple[float | None, str]] = []
        if when == "before":
            plan_.append((None, f"{token}:a"))
        elif when in ("during", "twice"):
            plan_.append((during, f"{token}:a"))
            if when == "twice":
                plan_.append((during + round(rng.uniform(0.2, 1.0), 2), f"{token}:b"))
        elif when == "after":
            plan_.append((round(timeout + rng.uniform(1.5, 3.0), 2), f"{token}:a"))
        items.append(Item(req, payload, signal_plan=plan_))


class Producer(threading.Thread):
    """Enqueues the plan in batches of 1-16 over ``spread`` seconds, through whatever fault is going on."""

    #: Tries of a batch refused with a definite "nothing was enqueued", and of keyed jobs after an unknown outcome.
    TRIES = 4

    def __init__(
        self,
        app: App,
        items: list[Item],
        seed: int,
        spread: float,
        stream: str = "producer",
        sizes: tuple[int, ...] = (1, 1, 2, 5, 8, 16),
    ) -> None:
        super().__init__(name=f"campaign-{stream}", daemon=True)
        self.app, self.items, self.spread, self.sizes = app, items, spread, sizes
        self.rng = random.Random(f"{stream}:{seed}")
        self.errors: Counter[str] = Counter()
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            batches, i = [], 0
            while i < len(self.items):
                size = self.rng.choice(self.sizes)
                batches.append(self.items[i : i + size])
                i += size
            pause = self.spread / max(len(batches), 1)
            for batch in batches:
                self._send(batch)
                time.sleep(pause)
        finally:
            self.finished.set()

    def _send(self, batch: list[Item]) -> None:
        pending = list(batch)
        for attempt in range(self.TRIES):
            if not pending:
                return
            now = time.time()
            for item in pending:
                req = item.request
                req.first_sent = req.first_sent or now
                req.last_sent = now
            try:
                refs = self.app.jobs.enqueue_many([item.body() for item in pending])
            except EnqueueOutcomeUnknown as exc:
                self.errors[type(exc).__name__] += 1
                for item in pending:
                    if item.request.outcome != hist.ACKED:
                        item.request.outcome = hist.UNKNOWN
                pending = [item for item in pending if item.request.key]  # only a key makes a retry safe
            except ConveyorError as exc:  # a definite "nothing was enqueued": the whole batch again
                self.errors[type(exc).__name__] += 1
            else:
                answered = time.time()
                for item, ref in zip(pending, refs):
                    item.request.outcome = hist.ACKED
                    item.acked_at = item.acked_at or answered
                    if ref.id not in item.request.job_ids:
                        item.request.job_ids.append(ref.id)
                return
            time.sleep(0.2 * (attempt + 1))

    def wait(self, timeout: float) -> None:
        if not self.finished.wait(timeout):
            raise AssertionError(f"the producer did not finish within {timeout:g}s")


class Canceller(threading.Thread):
    """Cancels the drawn jobs (:func:`cancels`) at their drawn times, through whatever fault is going on, and
    records each answer on its request: ``cancelled``, ``requested``, ``finished``, or UNKNOWN when the call
    raised (a reply lost: it may or may not have been stored)."""

    def __init__(self, app: App, items: list[Item], producers: list[Producer]) -> None:
        super().__init__(name="campaign-canceller", daemon=True)
        self.app, self.producers = app, producers
        self.pending = [item for item in items if item.cancel_after is not None]
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            while self.pending:
                now = time.time()
                due = [i for i in self.pending if i.acked_at and now >= i.acked_at + (i.cancel_after or 0.0)]
                if all(p.finished.is_set() for p in self.producers):  # never acknowledged: nothing to cancel
                    self.pending = [i for i in self.pending if i.acked_at]
                for item in due:
                    self.pending.remove(item)
                    self._cancel(item)
                time.sleep(0.02)
        finally:
            self.finished.set()

    def _cancel(self, item: Item) -> None:
        req = item.request
        req.cancel_sent = time.time()
        try:
            req.cancel = self.app.jobs.cancel(req.job_ids[0])
        except Exception as exc:  # noqa: BLE001 - any failure: the outcome is unknown
            req.cancel = hist.UNKNOWN
            req.cancel_error = type(exc).__name__
        req.cancel_answered = time.time()

    def wait(self, timeout: float) -> None:
        if not self.finished.wait(timeout):
            raise AssertionError(f"the canceller did not finish within {timeout:g}s")


class Signaller(threading.Thread):
    """Sends the waiters' signals (:func:`waiters`) at their drawn times, through whatever fault is going on:
    one meant before its enqueue at once, the others that many seconds after the enqueue's answer. Each
    call's data, times and outcome go on its request (ACKED when it returned, UNKNOWN when it raised)."""

    def __init__(self, app: App, items: list[Item], producers: list[Producer]) -> None:
        super().__init__(name="campaign-signaller", daemon=True)
        self.app, self.producers = app, producers
        self.pending = [(item, at, data) for item in items for at, data in item.signal_plan]
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            while self.pending:
                now = time.time()
                due = [p for p in self.pending if p[1] is None or (p[0].acked_at and now >= p[0].acked_at + p[1])]
                if all(p.finished.is_set() for p in self.producers):  # never acknowledged: nothing to signal
                    self.pending = [p for p in self.pending if p[0].acked_at or p[1] is None]
                for entry in due:
                    self.pending.remove(entry)
                    self._signal(entry[0], entry[2])
                time.sleep(0.02)
        finally:
            self.finished.set()

    def _signal(self, item: Item, data: str) -> None:
        req, sent = item.request, time.time()
        try:
            self.app.events.signal(req.event or "", data)
        except Exception:  # noqa: BLE001 - any failure: it may or may not have been stored
            outcome = hist.UNKNOWN
        else:
            outcome = hist.ACKED
        req.signals.append(hist.Signal(data, sent, time.time(), outcome))

    def wait(self, timeout: float) -> None:
        if not self.finished.wait(timeout):
            raise AssertionError(f"the signaller did not finish within {timeout:g}s")


@dataclasses.dataclass
class Applied:
    fault: nemesis.Fault
    started: float
    ended: float
    note: str = ""


class Stage:
    """The world one run's nemesis acts on."""

    def __init__(self, servers: Servers, cluster: Cluster, broker: str, proxy: ReplyDroppingProxy, seed: int) -> None:
        self.servers, self.cluster, self.broker, self.proxy = servers, cluster, broker, proxy
        self.rng = random.Random(f"targets:{seed}")
        self.applied: list[Applied] = []
        #: (real start, real end, seconds) of each Postgres clock step (keys' windows and delays move with it).
        self.pg_steps: list[tuple[float, float, float]] = []
        self.stopped: set[int] = set()
        #: (pid, UNIX start, end) of each pause.
        self.paused: list[tuple[int, float, float]] = []
        #: (worker group name, UNIX start, end) of each group whose clock was off (worker-clock).
        self.skewed: list[tuple[str, float, float]] = []
        #: The worker groups on the far host (in the network namespace partition cuts off).
        self.far_hosts: set[str] = set()
        self.old_workers: list = []
        self.poisoned: list[Item] = []
        #: Requests a kind made itself (user-retries' poll jobs), checked like the workload's.
        self.added: list[Item] = []
        #: What the time-limits kind found wrong with a worker's pool (a census short of connections, or none).
        self.pool_problems: list[str] = []
        #: (queue, UNIX time its primary was SIGKILLed) of each failover (redis-cluster).
        self.failovers: list[tuple[str, float]] = []
        self._locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._threads: list[threading.Thread] = []

    # -- running a schedule ---------------------------------------------------------

    def run(self, schedule: list[nemesis.Fault], started: float) -> None:
        for fault in schedule:
            delay = started + fault.at - time.time()
            if delay > 0:
                time.sleep(delay)
            thread = threading.Thread(target=self._apply, args=(fault,), name=f"nemesis-{fault.kind}", daemon=True)
            thread.start()
            self._threads.append(thread)
        for thread in self._threads:
            thread.join(120)

    def _apply(self, fault: nemesis.Fault) -> None:
        lock = self._locks[fault.target if fault.target not in ("body", "any", "slow-body", "hook") else "procs"]
        with lock:
            began = time.time()
            try:
                note = getattr(self, "_" + fault.kind.replace("-", "_"))(fault) or ""
            except Exception as exc:  # noqa: BLE001 - the nemesis records what it could not do
                note = f"nemesis error: {type(exc).__name__}: {exc}"[:200]
            self.applied.append(Applied(fault, began, time.time(), note))

    def heal(self) -> None:
        """Undo whatever is still in force (an error in the nemesis must not leave the world broken)."""
        for pid in list(self.stopped):
            _signal(pid, signal.SIGCONT)
        self.servers.namespace.heal()
        for clock in (self.servers.pg_clock, self.servers.worker_clock):
            clock.set(0)
        for server in (self.servers.pg, self.servers.redis):
            if not server.is_running:
                server.start()
        if self.broker == "redis":
            self._redis().config_set("maxmemory", 0)
        if self.broker == CLUSTER:
            for node in self.servers.cluster.nodes:
                if not node.is_running:
                    node.start()
            self.servers.cluster.wait_ready()
        for group in self.old_workers:
            if group.proc.poll() is None:
                self._leave(group, DRAIN_SECONDS)

    # -- targets ----------------------------------------------------------------------

    def _worker_pids(self) -> list[int]:
        """Live worker processes (one killed but not yet reaped by its supervisor is not)."""
        gone = self.stopped | set(self.cluster.kills)
        return [pid for s in self.cluster.supervisors for pid in s.child_pids() if pid not in gone]

    def _open(self, table: str, extra: str = "") -> list[int]:
        end = "ended_at IS NULL"
        query = f"SELECT DISTINCT pid FROM {table} WHERE {end} {extra}"
        with psycopg.connect(self.cluster.settings.database_url, autocommit=True, connect_timeout=3) as conn:
            return [r[0] for r in conn.execute(query).fetchall()]

    def _target_pid(self, target: str, wait: float = 4.0) -> int | None:
        live = set(self._worker_pids())
        deadline = time.time() + wait
        while True:
            try:
                if target == "any":
                    candidates = sorted(live)
                elif target == "hook":
                    candidates = sorted(set(self._open("fault_dead")) & live)
                elif target in ("slow-body", "fanout"):
                    marked = f"AND token IN (SELECT token FROM fault_marks WHERE mark = '{target}')"
                    candidates = sorted(set(self._open("fault_runs", marked)) & live)
                else:
                    candidates = sorted(set(self._open("fault_runs")) & live)
            except psycopg.Error:
                candidates = []
            if candidates:
                return self.rng.choice(candidates)
            if time.time() > deadline:
                return None
            time.sleep(0.05)
            live = set(self._worker_pids())

    # -- the kinds ----------------------------------------------------------------------

    def _kill(self, fault: nemesis.Fault) -> str:
        pid = self._target_pid(fault.target)
        if pid is None:
            return "no target"
        self.cluster.kill(pid)
        return f"pid {pid}"

    _kill_hook = _kill

    def _pause(self, fault: nemesis.Fault) -> str:
        pid = self._target_pid(fault.target)
        if pid is None:
            return "no target"
        self.stopped.add(pid)
        began = time.time()
        _signal(pid, signal.SIGSTOP)
        time.sleep(fault.duration)
        _signal(pid, signal.SIGCONT)
        self.stopped.discard(pid)
        self.paused.append((pid, began, time.time()))
        return f"pid {pid}"

    def _redis_crash(self, fault: nemesis.Fault) -> None:
        self.servers.redis.kill()
        time.sleep(fault.duration)
        self.servers.redis.start()

    def _postgres_crash(self, fault: nemesis.Fault) -> None:
        self.servers.pg.crash_immediate()
        time.sleep(fault.duration)
        self.servers.pg.start()

    def _step(self, clock: Clock, fault: nemesis.Fault) -> None:
        clock.set(fault.amount)
        time.sleep(fault.duration)
        clock.set(0)

    def _leave(self, group, timeout: float) -> str:
        """Drain a group that joined for a window; a process SIGKILLed because it did not drain in time is
        recorded as killed then (its runs ended with it)."""
        pids = group.child_pids()
        code = group.terminate(timeout=timeout)
        if code is None:
            at = time.time()
            for pid in pids:
                self.cluster.kills.setdefault(pid, at)
            return "SIGKILLed: it did not drain in time"
        return f"drained, exit {code}"

    def _worker_clock(self, fault: nemesis.Fault) -> str:
        """A worker group whose clock is off by ``amount`` joins for the window, its clock steps back
        half-way midway, and it leaves (drained; SIGKILLed if it does not drain in time).

        Only for a window, never the standing workers: under libfaketime a timed wait on a lock (the
        Postgres pool's, after a server crash) can hang for good, which is libfaketime's defect, not
        conveyor's (seen with the far host preloaded: jobs active until their time limit).
        """
        clock = self.servers.worker_clock
        clock.set(fault.amount)
        began = time.time()
        skewed = self.cluster.start_workers("skewed", wait=False, **clock.env)
        self.old_workers.append(skewed)
        try:
            time.sleep(fault.duration)
            clock.set(fault.amount / 2)
            time.sleep(WORKER_STEP_SECONDS)
        finally:
            note = self._leave(skewed, DRAIN_SECONDS)
            clock.set(0)
            self.skewed.append((skewed.name, began, time.time()))
        return note

    def _postgres_clock(self, fault: nemesis.Fault) -> str:
        """Step the server's clock by ``amount`` for the fault's duration, then back. A step comes at least a
        lease after the previous one's way back: recovery tells steps apart by comparing the server's clock
        with its own between passes, and two steps in one gap (back, then forward again) cancel out there
        while heartbeats written between them look a step old (the faults' lock serialises the steps)."""
        clock = self.servers.pg_clock
        last = max((ended for _, ended, _ in self.pg_steps), default=0.0)
        held = last + LEASE - time.time()
        if held > 0:
            time.sleep(held)
        began = time.time()
        self._step(clock, fault)
        self.pg_steps.append((began, time.time() + clock.lag, fault.amount))
        return f"held {held:.1f} s after the previous step" if held > 0 else ""

    def _partition(self, fault: nemesis.Fault) -> None:
        self.servers.namespace.cut()
        try:
            time.sleep(fault.duration)
        finally:
            self.servers.namespace.heal()

    def _drop_replies(self, fault: nemesis.Fault) -> str:
        before = self.proxy.dropped_bytes
        self.proxy.drop(fault.duration)
        return f"{self.proxy.dropped_bytes - before} bytes of replies lost"

    def _redis_oom(self, fault: nemesis.Fault) -> None:
        client = self._redis()
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", used + 64 * 1024)
        try:
            time.sleep(fault.duration)
        finally:
            client.config_set("maxmemory", 0)

    def _poison(self, fault: nemesis.Fault) -> str:
        """Enqueue jobs on a paused queue and make their stored messages undecodable before it resumes
        (a delayed message would not do: workers fetch it at once and hold it until it is due)."""
        broker, made = self.cluster.app.broker, []
        broker.pause_queue(POISON_QUEUE)
        try:
            for i in range(int(fault.amount)):
                token = f"poison-{fault.at}-{i}"
                req = hist.Request(token=token, job=f"fault.work.{POISON_QUEUE}", poison=True, outcome=hist.ACKED)
                item = Item(req, {"token": token, "effect": True})
                ref = self.cluster.app.jobs.enqueue_many([item.body()])[0]
                req.job_ids.append(ref.id)
                req.first_sent = req.last_sent = time.time()
                req.poison = self._make_undecodable(ref.id)
                self.poisoned.append(item)
                made += [ref.id] if req.poison else []
        finally:
            broker.resume_queue(POISON_QUEUE)
        return f"{len(made)} undecodable"

    def _make_undecodable(self, job_id: str) -> bool:
        """Give the stored message a top-level field no decoder knows (a newer producer's format)."""
        if self.broker == "postgres":
            with psycopg.connect(self.cluster.settings.database_url, autocommit=True) as conn:
                return bool(
                    conn.execute(
                        "UPDATE conveyor_jobs SET message = message || '{\"format_v9\": true}'::jsonb"
                        " WHERE id = %s AND status = 'pending'",
                        (job_id,),
                    ).rowcount
                )
        client, ns, changed = self._redis(), self.cluster.settings.redis_namespace, False
        for key in client.scan_iter(f"{ns}:*.msgs"):
            data = client.hget(key, job_id)
            for rid, raw in [(job_id, data)] if data else client.hgetall(key).items():
                message = json.loads(raw)
                if message.get("message_id") == job_id:
                    message["format_v9"] = True
                    client.hset(key, rid, json.dumps(message, separators=(",", ":")))
                    changed = True
        record = f"{ns}:job:{job_id}"  # the message is kept in the job's record too (promotion reads it)
        data = client.hget(record, "payload")
        if changed and data:
            message = json.loads(data)
            message["format_v9"] = True
            client.hset(record, "payload", json.dumps(message, separators=(",", ":")))
        return changed

    def _old_worker(self, fault: nemesis.Fault) -> str:
        old = self.cluster.start_workers("old", wait=False, CONVEYOR_IMPORTS=IMPORTS_OLD)
        self.old_workers.append(old)
        # Its window starts once it runs: on a loaded machine a worker takes longer to start than the
        # window lasts, and an old worker drained before it started saw nothing (seen: five in a row).
        old.wait_ready()
        time.sleep(fault.duration)
        return self._leave(old, DRAIN_SECONDS)

    def _enqueue_own(self, bodies: list[dict], keys: list[str]) -> list[str]:
        """A fault's own jobs, keyed and sent again until answered: another fault (a failover, a crash, lost
        replies) may refuse or lose the first try, and a job of unknown outcome left behind on a queue only
        this fault's group serves would wait there after the group left (stuck, by the harness's doing)."""
        keyed = [{**body, "key": key} for body, key in zip(bodies, keys)]
        deadline = time.time() + 30
        while True:
            try:
                return [ref.id for ref in self.cluster.app.jobs.enqueue_many(keyed)]
            except ConveyorError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)

    def _ended(self, job_ids: list[str], timeout: float) -> dict[str, str]:
        """Wait (up to ``timeout``) for the jobs to be terminal; their states then."""
        deadline, states = time.time() + timeout, {}
        while True:
            for job_id in job_ids:
                try:
                    record = self.cluster.app.broker.get_job(job_id)
                except ConveyorError:
                    continue  # the store is away (another fault): ask again
                states[job_id] = record.state if record else "missing"
            if all(states.get(j) in hist.TERMINAL for j in job_ids) or time.time() > deadline:
                return states
            time.sleep(0.2)

    def _time_limits(self, fault: nemesis.Fault) -> str:
        """A worker group (one process) on its own queue: hammering jobs meet thousands of time limits around
        pool checkouts and returns (tests.faults.jobs_extra), then a census in that process counts the
        connections its pool can still hand out: all of them, or a time limit leaked some (finding 8). A short
        census is taken again after a pause, and the last one judges (:func:`census_problem`)."""
        group = self.cluster.start_workers("limits", queues=(LIMITS_QUEUE,), wait=False)
        self.old_workers.append(group)
        token = f"limits-{fault.at}"
        try:
            threads = 3
            spec = {"job": "fault.hammer", "payload": {"token": token, "seconds": fault.duration}}
            hammers = self._enqueue_own([spec] * threads, [f"{token}-hammer-{i}" for i in range(threads)])
            group.wait_ready()  # only it serves its queue: started again if it refused to start (harness.py)
            states = self._ended(hammers, fault.duration + 20 + READY_SECONDS)
            query = f"SELECT what, got, size, landed, stats FROM fault_pools WHERE what IN ('hammer', '{token}') ORDER BY id"
            for n in range(1, CENSUSES + 1):
                spec = {"job": "fault.census", "payload": {"token": token}}
                census = self._enqueue_own([spec], [f"{token}-census" + (f"-{n}" if n > 1 else "")])[0]
                state = self._ended([census], 20)[census]
                rows = _rows(self.cluster.settings.database_url, query)
                counted = [r for r in rows if r[0] == token]
                if state != "completed" or not counted or counted[-1][1] >= counted[-1][2] or n == CENSUSES:
                    break
                time.sleep(RECENSUS_PAUSE)  # short: a leak stays short, a pool slow to open connections fills up
        finally:
            left = self._leave(group, DRAIN_SECONDS)
        landed = sum(r[3] for r in rows if r[0] == "hammer")
        counted = [(r[1], r[2], r[4]) for r in rows if r[0] == token]
        problem = census_problem(token, counted, landed, state, states)
        if problem:
            self.pool_problems.append(problem)
        got = " then ".join(f"{g}/{s}" for g, s, _ in counted) or "none"
        return f"{landed} time limits so far; census {got}; {_restarts(group)}{left}"

    def _user_retries(self, fault: nemesis.Fault) -> str:
        """A worker group with a user's middleware that re-enqueues the message proxy (tests.faults.user_retries)
        runs poll jobs on its own queue: each must run as often as it asked, then once with its effect, and
        end completed; a lost re-enqueue ends it early without its effect, a looping one never (finding 9)."""
        imports = f"{IMPORTS_NEW},tests.faults.user_retries"
        group = self.cluster.start_workers("polls", queues=(POLL_QUEUE,), wait=False, CONVEYOR_IMPORTS=imports)
        self.old_workers.append(group)
        rng = random.Random(f"polls:{fault.at}")
        made = []
        refused = ""
        try:
            for i in range(rng.randint(3, 6)):
                token = f"poll-{fault.at}-{i}"
                polls = rng.randint(1, 3)
                req = hist.Request(token=token, job="fault.poll", outcome=hist.ACKED, polls=polls, key=token)
                item = Item(req, {"token": token, "effect": True, "sleep": 0.02, "polls": polls})
                req.first_sent = time.time()
                try:
                    req.job_ids += self._enqueue_own([item.body()], [token])
                except ConveyorError as exc:  # the broker stayed away: serve what was made, then say so
                    refused = f"; the rest not enqueued: {type(exc).__name__}"
                    break
                req.last_sent = time.time()
                self.added.append(item)
                made += req.job_ids
            group.wait_ready()  # only it serves its queue: started again if it refused to start (harness.py)
            time.sleep(fault.duration)
            states = self._ended(made, 40 + READY_SECONDS)
        finally:
            left = self._leave(group, DRAIN_SECONDS)
        return f"{len(made)} poll jobs: {dict(Counter(states.values()))}{refused}; {_restarts(group)}{left}"

    def _failover(self, fault: nemesis.Fault) -> str:
        """SIGKILL the primary serving a drawn queue's slot, wait for the cluster to promote its replica (the
        nodes' timeout is 2 s), leave it so for the fault's duration, then start the killed node again: it
        rejoins as the new primary's replica (until it has synced, WAIT on that slot fails: enqueues there
        end of unknown outcome and claims go back, which is what CONVEYOR_REDIS_WAIT_REPLICAS is for)."""
        cluster = self.servers.cluster
        queue = self.rng.choice(list(WORK_QUEUES + (GROUP_QUEUE,)))
        slot_key = f"{self.cluster.settings.redis_namespace}{{{queue}}}:x"
        victim = cluster.owner(slot_key)
        victim.kill()
        killed = time.time()
        self.failovers.append((queue, killed))
        try:
            promoted = None
            while time.time() < killed + 60:
                try:
                    if cluster.owner(slot_key) is not victim:
                        promoted = time.time() - killed
                        break
                except (redis_lib.RedisError, OSError, StopIteration):
                    pass
                time.sleep(0.1)
            time.sleep(fault.duration)
        finally:
            victim.start()
        cluster.wait_ready()
        took = f"promoted in {promoted:.1f} s" if promoted is not None else "no replica promoted within 60 s"
        return f"{queue}: primary :{victim.port} SIGKILLed, {took}, restarted after {time.time() - killed:.1f} s"

    def _redis(self) -> redis_lib.Redis:
        return redis_lib.Redis.from_url(self.servers.redis.url, socket_timeout=5)

    def _redis_primaries(self) -> list[redis_lib.Redis]:
        """A client to each primary: the one Redis, or each cluster node that says it is a master."""
        if self.broker != CLUSTER:
            return [self._redis()]
        out = []
        for node in self.servers.cluster.nodes:
            if node.is_running:
                client = redis_lib.Redis(host="127.0.0.1", port=node.port, socket_timeout=5)
                if client.execute_command("ROLE")[0] == b"master":
                    out.append(client)
                else:
                    client.close()
        return out


def _restarts(group) -> str:
    return f"started again {group.restarts}x (a server was away); " if group.restarts else ""


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# -- gathering the history ---------------------------------------------------------------


def _rows(url: str, query: str) -> list[tuple]:
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        return conn.execute(query).fetchall()


def self_fenced(cluster: Cluster) -> dict[int, float]:
    """pid -> UNIX time by which a worker that logged ``self_fence`` was gone (see Checker.self_fenced)."""
    from conveyor.tasks.watchdog import LOG_GRACE

    out: dict[int, float] = {}
    for supervisor in cluster.supervisors:
        for event in supervisor.events("self_fence"):
            at = dt.datetime.strptime(event["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
            out[event["pid"]] = at.timestamp() + 0.001 + LOG_GRACE
    return out


#: Censuses the time-limits kind takes at most, and the pause before another when one came up short.
CENSUSES = 2
RECENSUS_PAUSE = 5.0


def census_problem(
    token: str, counted: list[tuple[int, int, str | None]], landed: int, state: str, hammers: dict
) -> str | None:
    """What the time-limits kind's censuses ((got, size, pool stats JSON) each, in order) say is wrong, or None.

    A connection a time limit leaked is never returned, so every census after it comes up short; a census
    short because the pool could not open its other connections within CENSUS_WAIT each (it opens them
    one at a time, and on a loaded machine, or while a server restarts, that can take longer) is followed
    by a full one. Only the last census judges, and the leak it reports is told with the pool's own count.
    """
    if state != "completed" or not counted:
        return f"{token}: the census after the time limits ended {state} (hammers {hammers})"
    got, size, stats = counted[-1]
    if got >= size:
        return None
    seen = " then ".join(f"{g}/{s}" for g, s, _ in counted)
    return (
        f"{token}: {size - got} of {size} pool connections leaked ({landed} time limits; censuses {seen}; pool {stats})"
    )


def gather(stage: Stage, items: list[Item]) -> hist.History:
    cluster, url = stage.cluster, stage.cluster.settings.database_url
    spooled: dict[str, dict] = {}
    for path in cluster.spool.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                spooled[record["run_id"]] = record
    fenced_exits = self_fenced(cluster)
    # Run times on the host's boot clock (every worker shares this kernel): no server clock step or
    # libfaketime moves it. Shown as UTC through this process's own offset to it.
    offset = time.time() - uptime()
    runs = []
    for run_id, job_id, token, delivery, pid, started_up, ended_up, ok, fenced, held, host in _rows(
        url,
        "SELECT run_id, job_id, token, delivery, pid, started_up, ended_up, ok, fenced, held, host FROM fault_runs",
    ):
        run_id = str(run_id)
        ended = None if ended_up is None else utc(offset + ended_up)
        if ended is None and run_id in spooled:
            ended, ok = utc(offset + spooled[run_id]["ended_up"]), spooled[run_id]["ok"]
            held = spooled[run_id].get("held")
        elif ended is None and pid in cluster.kills:
            ended, ok = utc(cluster.kills[pid]), False  # it died with its process
        elif ended is None and pid in fenced_exits:
            ended, ok = utc(fenced_exits[pid]), False  # its process fenced itself
        run = hist.Run(run_id, job_id, token, delivery, pid, utc(offset + started_up), ended, ok, fenced, held, host)
        runs.append(run)
    effects = [
        hist.Effect(str(r[0]), r[1], r[2], r[3], r[4])
        for r in _rows(url, "SELECT run_id, job_id, token, delivery, fenced FROM fault_effects")
    ]
    hooks = [
        hist.Hook(r[0], r[1], r[2]) for r in _rows(url, "SELECT job_id, token, ended_at IS NOT NULL FROM fault_dead")
    ]
    cancel_hooks = [hist.Hook(r[0], r[1], True) for r in _rows(url, "SELECT job_id, token FROM fault_cancels")]
    waits = [
        hist.WaitRow(str(r[0]), r[1], r[2], r[3], r[4])
        for r in _rows(url, "SELECT run_id, job_id, token, delivery, data FROM fault_waits")
    ]
    requests = _merge([item.request for item in items + stage.poisoned + stage.added])
    if stage.broker == "postgres":  # the broker's own clock stepped: keys' dedup windows are on it
        for req in requests:
            req.clock_stepped = any(
                began - DEDUP_TTL <= req.last_sent and req.first_sent <= ended for began, ended, _ in stage.pg_steps
            )
    relax_waits(stage, requests)
    requests += children(requests, items, runs)
    job_ids = {j for req in requests for j in req.job_ids} | {r.job_id for r in runs}
    states, why, started = {}, {}, {}
    for job_id in job_ids:
        record = cluster.app.broker.get_job(job_id)
        states[job_id] = record.state if record else "missing"
        if record is not None:
            why[job_id] = f"attempts {record.attempts}, error {(record.error or '')[:300]!r}" + fences(stage, job_id)
            if record.started_at is not None and not _maybe_stepped(stage, record.started_at):
                started[job_id] = record.started_at
    leftovers = {}
    for queue in WORK_QUEUES + EXTRA_QUEUES:
        counts = cluster.app.broker.queue_counts(queue)
        leftovers[queue] = (counts.waiting, counts.delayed, counts.active)
    reserved: dict[str, int] = {}
    if stage.broker in ("redis", CLUSTER):
        ns = cluster.settings.redis_namespace  # a cluster's keys are under ns{queue}: (tests: keys.py)
        for client in stage._redis_primaries():
            try:
                for key in client.scan_iter(f"{ns}*:__acks__.*"):
                    reserved[key.decode()] = int(client.scard(key))
                for key in client.scan_iter(f"{ns}*:*.msgs"):
                    if not key.endswith(b".XQ.msgs"):  # the dead letters are kept on purpose
                        reserved[key.decode()] = int(client.hlen(key))
            finally:
                client.close()
    entries = [
        (r[0], r[1], r[2])
        for r in _rows(url, "SELECT reference_id, user_id, amount FROM credit_entries WHERE kind = 'consume'")
    ]
    balances = {r[0]: r[1] for r in _rows(url, "SELECT user_id, balance FROM credit_accounts")}
    return hist.History(
        requests=requests,
        runs=runs,
        effects=effects,
        hooks=hooks,
        states=states,
        leftovers=leftovers,
        reserved=reserved,
        entries=entries,
        balances=balances,
        verify=ledger_verify(cluster, len(entries)),
        pool_problems=list(stage.pool_problems),
        dedup_ttl=DEDUP_TTL,
        why=why,
        started=started,
        cancel_hooks=cancel_hooks,
        group_cap=GROUP_CAP,
        broker=stage.broker,
        waits=waits,
        fault_windows=[
            (a.started - 1.0, a.ended + LEASE + RECOVERY + 3.0)
            for a in stage.applied
            if a.fault.kind in ACK_LOSING_KINDS
        ],
        process_windows=process_windows(stage),
        lease_faults=lease_faults(stage),
    )


#: A Redis job record's fields that say which delivery it is at, which one started last, and when it moved.
FENCE_FIELDS = ("rid", "delivery", "started_delivery", "worker", "started_at", "updated_at", "finished_at")


def fences(stage: Stage, job_id: str) -> str:
    """A Redis job record's delivery fence, for the checker's "why" (a job completed without a run: did the
    delivery that completed it start, and whose was it?); "" on Postgres or when it cannot be read."""
    if stage.broker not in ("redis", CLUSTER):
        return ""
    try:
        found = stage.cluster.app.broker.jobs.find(job_id)
    except Exception:  # noqa: BLE001 - a diagnostic only
        return ""
    if found is None:
        return ""
    row = {k.decode() if isinstance(k, bytes) else k: v for k, v in found[1].items()}
    shown = [
        f"{name} {row[name].decode() if isinstance(row[name], bytes) else row[name]}"
        for name in FENCE_FIELDS
        if name in row
    ]
    return "; " + ", ".join(shown) if shown else ""


def _maybe_stepped(stage: Stage, stamp: float) -> bool:
    """Whether a stamp of the broker's clock may be earlier than the truth: taken while postgres-clock had
    it stepped back (a record's times on Postgres are its ``now()``; Redis's TIME is the host's, which no
    fault moves). A forward step only makes a start look later: it can flag a run, never excuse one."""
    if stage.broker != "postgres":
        return False
    return any(a < 0 and began + a - 1.0 <= stamp <= ended + 1.0 for began, ended, a in stage.pg_steps)


#: Kinds that may lose the ack of any run that ended while they were in force (a kill or a pause loses
#: only its own process's: :func:`process_windows`).
ACK_LOSING_KINDS = ("redis-crash", "postgres-crash", "partition", "redis-oom", "postgres-clock", "failover")


#: Kinds that may take the lease of every run in progress (its worker can neither heartbeat nor be
#: heard): recovery may hand such a run's job to another worker while it goes on. Not postgres-clock:
#: recovery must see a step of the server's clock and declare nobody dead for it (issue 18, finding 7).
LEASE_TAKING_KINDS = ("redis-crash", "postgres-crash", "redis-oom", "failover")


def lease_faults(stage: Stage) -> list[hist.LeaseFault]:
    """The faults that may have taken a running delivery's lease, each over its window: from 1 s before it
    began until a lease, a recovery pass and 3 s after it healed (a pause: its process; a partition: the far
    host's groups; a worker group whose clock was off: that group; a server away or full: every worker)."""

    def window(began: float, ended: float) -> tuple[float, float]:
        return began - 1.0, ended + LEASE + RECOVERY + 3.0

    out = [
        hist.LeaseFault(a.fault.kind, *window(a.started, a.ended))
        for a in stage.applied
        if a.fault.kind in LEASE_TAKING_KINDS
    ]
    out += [hist.LeaseFault("pause", *window(began, ended), pid=pid) for pid, began, ended in stage.paused]
    out += [
        hist.LeaseFault("partition", *window(a.started, a.ended), host=host)
        for a in stage.applied
        if a.fault.kind == "partition"
        for host in sorted(stage.far_hosts)
    ]
    out += [hist.LeaseFault("worker-clock", *window(began, ended), host=name) for name, began, ended in stage.skewed]
    return out


def process_windows(stage: Stage) -> dict[int, list[tuple[float, float]]]:
    """Worker pid -> when a run of it that had ended may have lost its ack: killed (by a kill, or SIGKILLed
    when its group did not drain in time) within 2 s of that end, or stopped then (a pause)."""
    out: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for pid, at in stage.cluster.kills.items():
        out[pid].append((at - 2.0, at + 0.5))
    for pid, began, ended in stage.paused:
        out[pid].append((began - 2.0, ended + 0.5))
    return dict(out)


def relax_waits(stage: Stage, requests: list[hist.Request]) -> None:
    """A wait's timeout is a delay: measured on the broker's clock (Postgres: stepped by postgres-clock) and
    on the workers' (a delayed message's eta; worker-clock runs workers whose clock is off). A waiter whose
    wait overlapped either may time out before a signal that was in time: say so on its request."""
    skewed = [(a.started, a.ended + DRAIN_SECONDS) for a in stage.applied if a.fault.kind == "worker-clock"]
    stepped = [(b, e) for b, e, _ in stage.pg_steps] if stage.broker == "postgres" else []
    for req in requests:
        if not req.event or not req.first_sent:
            continue
        last = max([s.answered for s in req.signals] + [req.last_sent + req.wait_timeout])
        for began, ended, why in [(b, e, "a worker's clock was off") for b, e in skewed] + [
            (b, e, "the broker's clock stepped") for b, e in stepped
        ]:
            if began <= last and req.first_sent - 1.0 <= ended:
                req.wait_relaxed = why
        # WAIT covers enqueues and claims only: a signal (or the wait's stored answer) the slot's primary
        # acknowledged but had not replicated when it was killed is lost with it (asynchronous replication).
        queue = req.job.rsplit(".", 1)[-1]
        for failed, killed in stage.failovers:
            if failed == queue and any(killed - FAILOVER_LAG <= s.answered <= killed for s in req.signals):
                req.wait_relaxed = "a failover may have lost its signal (not WAITed)"


def children(requests: list[hist.Request], items: list[Item], runs: list[hist.Run]) -> list[hist.Request]:
    """The child jobs of fan-out bodies: acknowledged once a run of their parent reached its end."""
    parents_done = {r.token for r in runs if r.ok}
    job_ids: dict[str, set[str]] = defaultdict(set)
    for r in runs:
        job_ids[r.token].add(r.job_id)
    out = []
    for item in items:
        if item.duplicate or not item.payload.get("children"):
            continue
        for i in range(item.payload["children"]):
            spec = child(item.request.token, i, item.request.job.rsplit(".", 1)[1])
            token = spec["payload"]["token"]
            req = hist.Request(token=token, job=spec["job"], key=spec["key"], outcome=hist.REFUSED)
            if item.request.token in parents_done:
                req.outcome = hist.ACKED
            elif job_ids.get(token):
                req.outcome = hist.UNKNOWN  # the parent died after its enqueue, before its end
            req.job_ids = sorted(job_ids.get(token, ()))
            out.append(req)
    return out


def _merge(requests: list[hist.Request]) -> list[hist.Request]:
    """One request per token: a duplicate's answers join the original's (one logical job)."""
    out: dict[str, hist.Request] = {}
    for req in requests:
        first = out.get(req.token)
        if first is None:
            out[req.token] = dataclasses.replace(req, job_ids=list(req.job_ids))
            continue
        first.job_ids += [j for j in req.job_ids if j not in first.job_ids]
        rank = {hist.ACKED: 2, hist.UNKNOWN: 1, hist.REFUSED: 0}
        if rank[req.outcome] > rank[first.outcome]:
            first.outcome = req.outcome
        first.first_sent = min((x for x in (first.first_sent, req.first_sent) if x), default=0.0)
        first.last_sent = max(first.last_sent, req.last_sent)
    return list(out.values())


def ledger_verify(cluster: Cluster, entries: int) -> str:
    verify = subprocess.run(
        [sys.executable, "-m", "conveyor", "ledger", "verify"],
        env=env_for(cluster.settings),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if verify.returncode == 0 and f"{entries} entries, 0 mismatches" in verify.stdout:
        return ""
    return f"rc={verify.returncode} {verify.stdout.strip()[-200:]} {verify.stderr.strip()[-200:]}"


def settle(stage: Stage, items: list[Item], deadline: float) -> None:
    """Wait for every acknowledged job to end and the queues to be idle: until ``deadline``, and past it
    while the backlog still shrinks (a loaded host drains slowly: a worker killed late takes 15-20 s to
    start again at a load of 40), up to :data:`BACKLOG_GRACE` more. A backlog that stopped shrinking is
    left as it is: the checker calls it stuck."""
    broker = stage.cluster.app.broker
    ended: set[str] = set()
    cap = deadline + BACKLOG_GRACE
    least, shrank_at = None, time.time()
    while True:
        ids = {j for item in items + stage.poisoned + stage.added for j in item.request.job_ids[:1]} - ended
        for job_id in ids:
            record = broker.get_job(job_id)
            if record and record.state in hist.TERMINAL:
                ended.add(job_id)
        counts = [broker.queue_counts(q) for q in WORK_QUEUES + EXTRA_QUEUES]
        left = len(ids - ended) + sum(c.waiting + c.delayed + c.active for c in counts)
        if not left:
            return
        now = time.time()
        if least is None or left < least:
            least, shrank_at = left, now
        if now >= cap or (now >= deadline and now - shrank_at > BACKLOG_STALL):
            return
        time.sleep(0.3)


def stop_workers(stage: Stage) -> None:
    """Drain every worker group before the history is read, so the run log, the effects, the hooks and the
    states are read from a world where nothing runs: a job that ends between two of those reads would look
    completed without a run (seed 226143 on redis-cluster, gathered while a queue still drained). A group
    SIGKILLed because it did not drain in time is recorded as killed then (its runs ended with it)."""
    cluster = stage.cluster
    for supervisor in cluster.supervisors:
        supervisor.send_stop()
    for supervisor in cluster.supervisors:
        if supervisor.proc.poll() is not None:
            continue
        pids = supervisor.child_pids()
        if supervisor.terminate(timeout=30) is None:
            at = time.time()
            for pid in pids:
                cluster.kills.setdefault(pid, at)


@dataclasses.dataclass
class Outcome:
    seed: int
    broker: str
    schedule: list[nemesis.Fault]
    applied: list[Applied]
    history: hist.History
    anomalies: dict[str, list[str]]
    producer_errors: dict[str, int]
    seconds: float

    @property
    def jobs(self) -> int:
        return sum(1 for r in self.history.requests if r.outcome == hist.ACKED)


def run(servers: Servers, workdir: Path, broker: str, seed: int, size: Size, kinds: list[str]) -> Outcome:
    """One campaign run on ``broker``: the world, the workload and the schedule of ``seed``, the verdict."""
    from tests.faults.conftest import ensure_template

    t0 = time.monotonic()
    schedule = nemesis.schedule(seed, broker, window=size.window, faults=size.faults, kinds=kinds)
    pg, redis = servers.pg, servers.redis
    name = f"campaign_{seed}_{broker}"[:60].replace("-", "_")
    pg.drop_database(name)
    pg.create_database(name, template=ensure_template(pg))
    overrides: dict = {"imports": IMPORTS_NEW, "redis_socket_timeout": REDIS_TIMEOUT}
    if broker == CLUSTER:
        servers.cluster.wait_ready()
        servers.cluster.flush()
        redis_url: str | None = servers.cluster.url
        # Every enqueue and claim WAITs for the slot's replica: a failover loses none of them.
        overrides.update(redis_wait_replicas=1, redis_wait_timeout=CLUSTER_WAIT_TIMEOUT)
    else:
        client = redis_lib.Redis.from_url(redis.url)
        try:
            client.flushall()
            client.config_set("maxmemory", 0)
        finally:
            client.close()
        redis_url = redis.url if broker == "redis" else None
    settings = fault_settings("redis" if broker == CLUSTER else broker, redis_url, pg.url(name), **overrides)
    env = {"CONVEYOR_IMPORTS": IMPORTS_NEW, "CONVEYOR_REDIS_SOCKET_TIMEOUT": str(REDIS_TIMEOUT)}
    if broker == CLUSTER:
        env["CONVEYOR_REDIS_WAIT_TIMEOUT"] = str(CLUSTER_WAIT_TIMEOUT)
    cluster = Cluster(settings, workdir / f"{broker}-{seed}", env)
    upstream = ("127.0.0.1", redis.port) if broker == "redis" else ("127.0.0.1", pg.port)
    proxy = ReplyDroppingProxy(*upstream)
    via = settings.model_copy(
        update={"redis_url": proxy.url_for(settings.redis_url)}
        if broker == "redis"
        else {"database_url": proxy.url_for(settings.database_url)}
        if broker == "postgres"
        else {}  # a cluster client follows the nodes' addresses: no proxy (drop-replies is not drawn)
    )
    producer_app = App(via)
    stage = Stage(servers, cluster, broker, proxy, seed)
    try:
        address = servers.namespace.host_address
        remote = settings.model_copy(
            update={
                "database_url": pg.url_on(address, name),
                "redis_url": redis.url_on(address) if broker == "redis" else None,
            }
        )
        # The near and far hosts serve the capped queue of grouped jobs too: the cap holds across both.
        served = WORK_QUEUES + (GROUP_QUEUE,)
        near = cluster.start_workers("near", queues=served, wait=False)
        hosts = [near]
        if broker != CLUSTER:  # the nodes bind loopback only: no far host (partition is not drawn)
            far = cluster.start_workers(
                "far", queues=served, prefix=servers.namespace.prefix, settings=remote, wait=False
            )
            hosts.append(far)
            stage.far_hosts.add(far.name)
        for host in hosts:
            host.wait_ready()
        items = plan(seed, size.jobs, settings.price_per_1k_tokens, slow_hooks="kill-hook" in kinds)
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE fault_marks (token TEXT, mark TEXT, PRIMARY KEY (token, mark))")
            marks = [(i.request.token, "slow-body") for i in items if i.payload.get("sleep", 0) >= 1.0]
            marks += [(i.request.token, "fanout") for i in items if i.payload.get("children")]
            conn.cursor().executemany("INSERT INTO fault_marks VALUES (%s, %s) ON CONFLICT DO NOTHING", marks)
        # The grouped jobs have a producer of their own: the rest goes out in the batches it always did.
        producer = Producer(
            producer_app, [i for i in items if i.request.group is None and not i.request.event], seed, size.window
        )
        waits_producer = Producer(
            producer_app, [i for i in items if i.request.event], seed, size.window, "waits-producer", sizes=(1,)
        )
        grouped_producer = Producer(
            producer_app, [i for i in items if i.request.group is not None], seed, size.window, "groups-producer"
        )
        canceller = Canceller(producer_app, items, [producer, grouped_producer])
        signaller = Signaller(producer_app, items, [waits_producer])
        started = time.time()
        for thread in (producer, grouped_producer, canceller, waits_producer, signaller):
            thread.start()
        try:
            stage.run(schedule, started)
        finally:
            stage.heal()
        producer.wait(timeout=120)
        grouped_producer.wait(timeout=120)
        canceller.wait(timeout=60)
        waits_producer.wait(timeout=120)
        signaller.wait(timeout=60)
        # A step of the broker's clock back (the end of a forward step) postpones every delay set meanwhile.
        stepped = max((a for _, _, a in stage.pg_steps), default=0.0) if broker == "postgres" else 0.0
        settle(stage, items, time.time() + QUIET + stepped)
        stop_workers(stage)
        history = gather(stage, items)
        anomalies = hist.check(history)
    finally:
        try:
            stage.heal()
        finally:
            proxy.close()
            producer_app.close()
            cluster.close()
    return Outcome(
        seed,
        broker,
        schedule,
        stage.applied,
        history,
        anomalies,
        dict(producer.errors + grouped_producer.errors + waits_producer.errors),
        time.monotonic() - t0,
    )

"""What must hold after every fault, checked from the outside.

- every acknowledged enqueue ended completed or failed (as planned) within
  the lease + recovery interval + a drain allowance after the fault healed:
  none stuck, none lost (a "completed" job must show its effect: a
  successful run in the run log, its ledger entry);
- no job had two runs at once (from the run log, on the database's clock);
- the ledger holds exactly the unique charges, with the expected balances,
  and ``conveyor ledger verify`` agrees;
- each final-failure hook ran once, and only for jobs that failed for good;
- a repeated key returned the first job, and every key is free again once
  its job has ended and its dedup TTL is over.

The figures go into a :class:`~tests.faults.report.Row` (recorded before
anything is asserted, so a failing scenario shows in docs/reliability.md).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from collections import Counter, defaultdict
from decimal import Decimal

import psycopg

from conveyor.ledger import credits
from tests.faults import report
from tests.faults.harness import DEDUP_TTL, LEASE, RECOVERY, Cluster, utc
from tests.faults.jobs import WORK_QUEUES
from tests.faults.workload import Planned
from tests.support.harness import ROOT, env_for

#: Seconds, on top of the lease and the recovery interval, for the backlog a fault left to drain
#: (retries' backoff, slow jobs, a loaded CI machine). A job later than that is stuck.
DRAIN_ALLOWANCE = 30.0

TERMINAL = ("completed", "failed")


def _rows(url: str, query: str, params=None) -> list[tuple]:
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        return conn.execute(query, params).fetchall()


class Run:
    """One run from the run log, with its end resolved."""

    def __init__(self, run_id, job_id, token, attempt, delivery, host, pid, started_at, effect_at, ended_at, ok):
        self.run_id, self.job_id, self.token, self.attempt = str(run_id), job_id, token, attempt
        self.delivery, self.host, self.pid = delivery, host, pid
        self.started_at, self.effect_at, self.ended_at, self.ok = started_at, effect_at, ended_at, ok
        self.end_known = ended_at is not None

    def __repr__(self) -> str:
        end = self.ended_at.isoformat() if self.ended_at else "?"
        return (
            f"run(job={self.job_id} {self.token} attempt={self.attempt} delivery={self.delivery} "
            f"{self.host}/{self.pid} {self.started_at.time()}..{end[11:]} ok={self.ok})"
        )


class Checker:
    def __init__(self, cluster: Cluster, items: list[Planned], *, fault: str) -> None:
        self.cluster = cluster
        self.app = cluster.app
        self.items = items
        self.fault = fault
        self.broker_name = cluster.settings.broker_name
        self.url = cluster.settings.database_url
        self.notes: list[str] = []

    # -- the jobs the producer was told exist -----------------------------------

    def jobs(self) -> dict[str, Planned]:
        """Acknowledged job id -> what was planned for it (the first request that named it)."""
        out: dict[str, Planned] = {}
        for item in self.items:
            if item.acknowledged and item.ref_id not in out:
                out[item.ref_id] = item
        return out

    def settle(self, healed_at: float, *, producer=None) -> tuple[float | None, dict[str, str]]:
        """Wait until every acknowledged job has ended (or the deadline); returns (recovery s, states)."""
        if producer is not None:
            producer.wait()
        deadline = max(healed_at, time.time()) + LEASE + RECOVERY + DRAIN_ALLOWANCE
        ended_at: dict[str, float] = {}
        states: dict[str, str] = {}
        while True:
            jobs = self.jobs()
            pending = [job_id for job_id in jobs if job_id not in ended_at]
            for job_id in pending:
                record = self.app.broker.get_job(job_id)
                states[job_id] = record.state if record else "missing"
                if record and record.state in TERMINAL:
                    ended_at[job_id] = time.time()
            idle = not pending or all(j in ended_at for j in pending)
            if idle and self._queues_idle():
                break
            if time.time() >= deadline:
                break
            time.sleep(0.2)
        # Final states, read again: a job must not leave its end (a late rerun re-opening it).
        self.errors = {}
        for job_id in self.jobs():
            record = self.app.broker.get_job(job_id)
            states[job_id] = record.state if record else "missing"
            if record and record.error:
                self.errors[job_id] = record.error
        last = max(ended_at.values(), default=None)
        recovery = None if last is None else max(0.0, last - healed_at)
        if any(s not in TERMINAL for s in states.values()):
            recovery = None
        return recovery, states

    def _queues_idle(self) -> bool:
        for queue in WORK_QUEUES:
            counts = self.app.broker.queue_counts(queue)
            if counts.waiting or counts.delayed or counts.active:
                return False
        return True

    # -- the run log -------------------------------------------------------------

    def runs(self) -> list[Run]:
        runs = [
            Run(*r)
            for r in _rows(
                self.url,
                "SELECT run_id, job_id, token, attempt, delivery, host, pid, "
                "started_at, effect_at, ended_at, ok FROM fault_runs ORDER BY started_at, delivery",
            )
        ]
        spooled: dict[str, dict] = {}
        for path in self.cluster.spool.glob("*.jsonl"):
            for line in path.read_text().splitlines():
                if line.strip():
                    record = json.loads(line)
                    spooled[record["run_id"]] = record
        fenced = self.self_fenced()
        for run in runs:
            if run.ended_at is None and run.run_id in spooled:
                record = spooled[run.run_id]
                run.ended_at = run.started_at + dt.timedelta(seconds=record["elapsed"])
                run.ok = record["ok"]
                run.end_known = True
            elif run.ended_at is None and run.pid in self.cluster.kills:
                run.ended_at = utc(self.cluster.kills[run.pid])  # it died with its process
                run.ok = False
                run.end_known = True
            elif run.ended_at is None and run.pid in fenced:
                run.ended_at = utc(fenced[run.pid])  # its process fenced itself (os._exit)
                run.ok = False
                run.end_known = True
        return runs

    def self_fenced(self) -> dict[int, float]:
        """pid -> UNIX time by which a worker that logged ``self_fence`` was gone.

        The watchdog arms an os._exit LOG_GRACE seconds out before it logs,
        then exits right after the line: the line's time plus LOG_GRACE bounds
        the end of every run the process had.
        """
        from conveyor.tasks.watchdog import LOG_GRACE

        out: dict[int, float] = {}
        for supervisor in self.cluster.supervisors:
            for event in supervisor.events("self_fence"):
                at = dt.datetime.strptime(event["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
                out[event["pid"]] = at.timestamp() + 0.001 + LOG_GRACE
        return out

    @staticmethod
    def overlaps(runs: list[Run]) -> dict[str, list[tuple[Run, Run]]]:
        """Job id -> pairs of its runs that were running at the same time (an unknown end is 'still running')."""
        forever = dt.datetime.max.replace(tzinfo=dt.UTC)
        by_job: dict[str, list[Run]] = defaultdict(list)
        for run in runs:
            by_job[run.job_id].append(run)
        out: dict[str, list[tuple[Run, Run]]] = {}
        for job_id, job_runs in by_job.items():
            job_runs.sort(key=lambda r: r.started_at)
            for i, a in enumerate(job_runs):
                for b in job_runs[i + 1 :]:
                    if b.started_at < (a.ended_at or forever):
                        out.setdefault(job_id, []).append((a, b))
        return out

    # -- the ledger ---------------------------------------------------------------

    def ledger_problems(self, jobs: dict[str, Planned]) -> tuple[list[str], list[str]]:
        """(missing charges, extra or wrong charges)."""
        price = self.cluster.settings.price_per_1k_tokens
        required = {item.charge[0]: item.charge for item in jobs.values() if item.charge}
        allowed = dict(required)
        for item in self.items:
            if item.charge and (item.maybe or item.acknowledged):
                allowed.setdefault(item.charge[0], item.charge)
        entries = _rows(self.url, "SELECT reference_id, user_id, amount FROM credit_entries WHERE kind = 'consume'")
        counts = Counter(e[0] for e in entries)
        missing = sorted(set(required) - set(counts))
        extra = sorted(r for r in counts if r not in allowed) + sorted(r for r, n in counts.items() if n > 1)
        wrong = [
            f"{ref}: {amount} != {-credits.cost(allowed[ref][2], price)}"
            for ref, _, amount in entries
            if ref in allowed and amount != -credits.cost(allowed[ref][2], price)
        ]
        expected: dict[str, Decimal] = defaultdict(Decimal)
        for ref in counts:
            if ref in allowed:
                expected[allowed[ref][1]] -= credits.cost(allowed[ref][2], price)
        balances = dict(_rows(self.url, "SELECT user_id, balance FROM credit_accounts"))
        mismatched = [
            f"{user}: balance {balances.get(user)} != {value}"
            for user, value in expected.items()
            if balances.get(user) != value
        ]
        verify = subprocess.run(
            [sys.executable, "-m", "conveyor", "ledger", "verify"],
            env=env_for(self.cluster.settings),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if verify.returncode != 0 or f"{len(entries)} entries, 0 mismatches" not in verify.stdout:
            mismatched.append(
                f"conveyor ledger verify: rc={verify.returncode} {verify.stdout.strip()} {verify.stderr.strip()[-300:]}"
            )
        return missing, extra + wrong + mismatched

    # -- keys -----------------------------------------------------------------------

    def key_problems(self, jobs: dict[str, Planned]) -> tuple[list[str], list[str]]:
        """(duplicates that did not get the first job, keys still held after their job ended and TTL)."""
        not_deduplicated = []
        for item in self.items:
            original = item.duplicate_of
            if original is None or not (item.acknowledged and original.acknowledged):
                continue
            if item.sent_at - original.done_at > DEDUP_TTL * 0.75:
                continue  # sent when the key may already have expired (the producer was held up)
            if not item.deduplicated or item.ref_id != original.ref_id:
                not_deduplicated.append(f"{item.key}: {item.ref_id} (dedup={item.deduplicated}) != {original.ref_id}")
        keys = sorted({item.key for item in jobs.values() if item.key})
        if not keys:
            return not_deduplicated, []
        last = max(item.done_at or item.sent_at for item in self.items if item.key)
        wait = last + DEDUP_TTL + 0.5 - time.time()
        if wait > 0:
            time.sleep(wait)
        requests = [
            {"job": "fault.work.nudge", "payload": {"token": f"rekey-{i}"}, "key": key} for i, key in enumerate(keys)
        ]
        refs = self.app.jobs.enqueue_many(requests)
        held = [f"{key} -> {ref.id}" for key, ref in zip(keys, refs) if ref.deduplicated]
        return not_deduplicated, held

    # -- everything ------------------------------------------------------------------

    def check(
        self,
        healed_at: float,
        *,
        producer=None,
        expect_no_reruns: bool = False,
        extra_problems: list[str] | None = None,
    ) -> report.Row:
        recovery, states = self.settle(healed_at, producer=producer)
        jobs = self.jobs()
        runs = self.runs()
        runs_by_job: dict[str, list[Run]] = defaultdict(list)
        for run in runs:
            runs_by_job[run.job_id].append(run)
        dead = Counter(r[0] for r in _rows(self.url, "SELECT job_id FROM fault_dead"))
        missing_charges, bad_charges = self.ledger_problems(jobs)
        charged = {r[0] for r in _rows(self.url, "SELECT reference_id FROM credit_entries")}

        problems: dict[str, list[str]] = defaultdict(list)
        for job_id, item in jobs.items():
            state = states.get(job_id, "missing")
            token = item.payload.get("token") or item.key
            if state not in TERMINAL and state != "missing":
                problems["stuck"].append(f"{token} ({job_id}) is {state}")
                continue
            if state != item.expect:
                problems["lost"].append(
                    f"{token} ({job_id}) ended {state}, expected {item.expect} "
                    f"(error: {self.errors.get(job_id, '')[:150]!r})"
                )
                continue
            ok_runs = [r for r in runs_by_job.get(job_id, []) if r.ok]
            if item.expect == "completed":
                if item.logged and not ok_runs:
                    problems["lost"].append(
                        f"{token} ({job_id}) is completed but never ran to its end: {runs_by_job.get(job_id)}"
                    )
                if item.charge and item.charge[0] not in charged:
                    problems["lost"].append(f"{token} ({job_id}) is completed but its charge is missing")
                if dead.get(job_id):
                    problems["doubled"].append(f"{token} ({job_id}) completed, yet its final-failure hook ran")
            else:
                if dead.get(job_id, 0) == 0:
                    problems["lost"].append(f"{token} ({job_id}) failed but its final-failure hook never ran")
                elif dead[job_id] > 1:
                    problems["doubled"].append(f"{token} ({job_id}): final-failure hook ran {dead[job_id]} times")
        problems["lost"] += [f"charge {ref} missing" for ref in missing_charges]
        problems["doubled"] += [f"ledger: {p}" for p in bad_charges]
        not_deduplicated, held = self.key_problems(jobs)
        problems["doubled"] += [f"key did not deduplicate: {p}" for p in not_deduplicated]
        problems["stuck"] += [f"key still held: {p}" for p in held]
        overlapping = self.overlaps(runs)
        for job_id, pairs in overlapping.items():
            problems["overlapping"].append(f"{job_id}: {pairs[0][0]} and {pairs[0][1]}")
        reruns = {job_id: n for job_id, n in Counter(r.job_id for r in runs if r.ok).items() if n > 1}
        if expect_no_reruns:
            for job_id, n in reruns.items():
                problems["doubled"].append(f"{job_id} ran to its end {n} times: {runs_by_job[job_id]}")
        problems["other"] += extra_problems or []

        def count(kind: str) -> int:
            return len(problems.get(kind, []))

        row = report.Row(
            fault=self.fault,
            broker=self.broker_name,
            jobs=len(jobs),
            lost=count("lost"),
            doubled=count("doubled"),
            overlapping=len(overlapping),
            stuck=count("stuck"),
            recovery=recovery,
            reruns=len(reruns),
            runs=len(runs),
            maybe=sum(1 for item in self.items if item.maybe and not item.acknowledged),
            notes="; ".join(
                p[:160]
                for kind in ("lost", "doubled", "overlapping", "stuck", "other")
                for p in problems.get(kind, [])[:2]
            ),
        )
        report.record(row)
        failures = {kind: found for kind, found in problems.items() if found}
        assert not failures, f"{self.fault} on {self.broker_name}: " + json.dumps(
            {
                kind: found[:10] + ([f"... {len(found) - 10} more"] if len(found) > 10 else [])
                for kind, found in failures.items()
            },
            indent=1,
            default=str,
        )
        return row

"""``conveyor demo``: a bounded, realistic, self-checking run of the whole platform.

On whatever is configured (by default the embedded Postgres, nothing
installed) it starts worker processes for every queue, starts N agent
rounds and reads their streams as a client would, lets the end-of-round
jobs run (charges, memory extraction, indexing), sends deliberate
duplicate finalizes and injects transient failures
(``CONVEYOR_FAULT_RATE``), shows live per-queue progress, then checks the
outcome and exits non-zero if any check fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from conveyor.cli import env_flag

if TYPE_CHECKING:
    import subprocess

    import psycopg
    from psycopg.rows import TupleRow
    from rich.console import Console, Group

    from conveyor.app import App
    from conveyor.cli import Subcommands
    from conveyor.platform.settings import PlatformSettings
    from conveyor.platform.streams.base import StreamEntry
    from conveyor.tasks.worker import InlineWorkers

#: What the demo's users ask: realistic prompts, each starting one round.
PROMPTS = (
    "Plan the postgres migration for friday and list the risks",
    "Summarise the customer feedback about invoices from this week",
    "Draft the incident review for the outage on tuesday",
    "Prepare the onboarding checklist for the new python engineers",
    "Compare the pricing of the three cloud vendors for storage",
    "Write release notes for the dashboard redesign",
    "Find the flaky tests in the payments service and propose fixes",
    "Outline the quarterly roadmap for the search team",
)

#: Credits the demo user starts with.
STARTING_CREDITS = Decimal("100")

#: The demo's fault rate when neither --fault-rate nor CONVEYOR_FAULT_RATE says otherwise
#: (everywhere else the rate is 0 unless configured): the demo must show retries.
DEMO_FAULT_RATE = 0.2


def register(sub: Subcommands) -> None:
    p = sub.add_parser("demo", help="a bounded, self-checking run of the whole platform (embedded by default)")
    env_flag(p, "--runs", env="CONVEYOR_DEMO_RUNS", type=int, help="agent rounds to run")
    env_flag(
        p,
        "--duplicates",
        env="CONVEYOR_DEMO_DUPLICATES",
        type=int,
        help="rounds that get two extra, unkeyed finalizes (default: a quarter of the runs)",
    )
    p.add_argument(
        "--fault-rate",
        type=float,
        default=None,
        help=f"share of first attempts that fail on purpose [env: CONVEYOR_FAULT_RATE; "
        f"unset: {DEMO_FAULT_RATE:g} in the demo]",
    )
    env_flag(p, "--timeout", env="CONVEYOR_DEMO_TIMEOUT", type=float, help="seconds before the demo gives up and fails")
    env_flag(p, "--processes", env="CONVEYOR_WORKER_PROCESSES", type=int, help="worker processes per queue")
    p.set_defaults(func=cmd_demo)


class Check(NamedTuple):
    name: str
    ok: bool
    detail: str


class Progress:
    """What the live view and the checks read; refreshed from the database and the broker.

    A plain class, not a dataclass: ``dataclasses`` (and ``inspect`` with it) would be imported
    to build the parser of every ``conveyor`` command.
    """

    def __init__(self) -> None:
        #: Run id -> (id, status, attempts, assistant message id, finalized): demo.sql's ``runs`` row.
        self.runs: dict[str, tuple[Any, ...]] = {}
        self.chunks = 0
        self.charges = 0
        self.extractions = 0
        self.memories = 0
        self.indexed = 0
        self.index_chunks = 0


#: What the demo tells a newcomer to try once it has passed.
NEXT_STEPS = """next:
  conveyor up                      the whole system on this machine; dashboard at http://127.0.0.1:8000/admin/queues
                                   (set CONVEYOR_ADMIN_TOKEN first to sign in)
  conveyor status                  per-queue counts;  conveyor --help  every command and variable
  your own jobs                    README.md, "Quickstart": a queue, a job, a worker and a result in ten lines"""


def cmd_demo(args: argparse.Namespace) -> int:
    from conveyor.cli import resolve_settings_flags
    from conveyor.platform.settings import from_environment

    configured = from_environment()
    resolve_settings_flags(args, configured)  # --runs, --duplicates, --timeout: the platform's settings
    if args.runs < 1:
        print("conveyor: error: --runs must be at least 1", file=sys.stderr)
        return 2
    from rich.console import Console

    from conveyor.app import App
    from conveyor.logs import configure_logging
    from conveyor.schema.migrate import migrate
    from conveyor.settings import get_settings

    config = demo_settings(configured, args.fault_rate)
    args.fault_rate = config.fault_rate
    # A pipe or a CI log is no 80-column terminal: don't hard-wrap the summary there.
    console = Console(stderr=False, width=None if sys.stdout.isatty() else 160)
    app = App(get_settings(), blueprint_settings=[config])
    configure_logging("WARNING", secrets=app.secret_values())
    started = time.monotonic()
    where = f"embedded Postgres in {app.settings.data_dir}" if app.settings.embedded else "DATABASE_URL"
    console.print(
        f"[bold]conveyor demo[/]: {args.runs} rounds on broker [cyan]{app.settings.broker_name}[/], "
        f"records in {where}, fault rate {args.fault_rate:g}"
    )
    migrate(app.database_url, app.blueprints)

    demo = Demo(app, args, console)
    try:
        demo.start_workers()
        demo.run()
    finally:
        demo.stop_workers()
    checks = demo.check(time.monotonic() - started)
    app.close()
    return 0 if all(c.ok for c in checks) else 1


def demo_settings(settings: PlatformSettings, fault_rate: float | None) -> PlatformSettings:
    """The demo's settings: the configured ones, on the deterministic local model whatever is configured
    (it must not spend money), with its own fault rate and chunk delay unless those were set."""
    update: dict[str, Any] = {"provider": "local"}
    if fault_rate is not None:
        update["fault_rate"] = fault_rate
    elif "fault_rate" not in settings.model_fields_set:
        update["fault_rate"] = DEMO_FAULT_RATE
    if "local_chunk_delay" not in settings.model_fields_set:
        update["local_chunk_delay"] = 0.01
    return settings.model_validate({**settings.model_dump(exclude_unset=True, by_alias=False), **update})


def worker_env(settings: PlatformSettings) -> dict[str, str]:
    """The environment of the demo's `conveyor worker`: this process's, plus what the demo changed in its settings
    (the child reads its settings from its environment; this process's own is never changed)."""
    return {
        **os.environ,
        "CONVEYOR_LOG_LEVEL": "INFO",
        "CONVEYOR_PROVIDER": settings.provider,
        "CONVEYOR_FAULT_RATE": repr(settings.fault_rate),
        "CONVEYOR_LOCAL_CHUNK_DELAY": repr(settings.local_chunk_delay),
    }


class Demo:
    def __init__(self, app: App, args: argparse.Namespace, console: Console) -> None:
        import tempfile
        import uuid

        self.app, self.args, self.console = app, args, console
        self.id = f"demo-{uuid.uuid4().hex[:8]}"
        self.user_id = f"{self.id}-user"
        duplicates = args.duplicates if args.duplicates is not None else max(1, args.runs // 4)
        self.duplicates_wanted = min(duplicates, args.runs)
        self.duplicated: set[str] = set()
        self.read_upto: dict[str, int] = {}
        self.stream_entries: dict[str, list[StreamEntry]] = {}
        self.timed_out = False
        self.baseline: dict[str, tuple[int, int]] = {}
        self.workers: subprocess.Popen[bytes] | None = None
        self.inline: InlineWorkers | None = None
        self.log_path = Path(tempfile.gettempdir()) / f"conveyor-{self.id}-workers.log"

    # -- workers ------------------------------------------------------------------

    def start_workers(self) -> None:
        self.baseline = {
            q: (c.completed_total, c.failed_total) for q in self.app.queues for c in [self.app.broker.queue_counts(q)]
        }
        if self.app.capabilities.in_process:
            from conveyor.tasks.worker import InlineWorkers

            self.inline = InlineWorkers(self.app).start()
            self.console.print("workers: every queue, inside this process (inline broker)")
            return
        import subprocess

        from conveyor.platform.settings import platform_settings

        log = open(self.log_path, "w")
        # `conveyor worker`: a Supervisor with one group per queue, as in production.
        self.workers = subprocess.Popen(
            [sys.executable, "-m", "conveyor", "worker", "--processes", str(self.args.processes)],
            stdout=log,
            stderr=log,
            env=worker_env(platform_settings(self.app)),
        )
        log.close()
        self.console.print(
            f"workers: {len(self.app.queues) * self.args.processes} processes "
            f"(pid {self.workers.pid}), logs in {self.log_path}"
        )

    def stop_workers(self) -> None:
        import subprocess

        if self.inline is not None:
            self.inline.stop()
        if self.workers is not None and self.workers.poll() is None:
            self.workers.terminate()
            try:
                self.workers.wait(30)
            except subprocess.TimeoutExpired:
                self.workers.kill()
                self.workers.wait()

    # -- the workload ---------------------------------------------------------------

    def run(self) -> None:
        from rich.live import Live

        from conveyor.ledger import credits
        from conveyor.platform import records
        from conveyor.platform.rounds import start_round

        with self.app.pool.connection() as conn:
            credits.top_up(conn, user_id=self.user_id, amount=STARTING_CREDITS, reference=self.id)
            for n in range(self.args.runs):
                records.create_task(
                    conn,
                    id=f"{self.id}-task{n}",
                    user_id=self.user_id,
                    kind="task" if n % 2 else "chat",
                    title=f"Demo task {n}",
                    instructions="Answer in three short lines.",
                )
        self.run_ids = [
            start_round(self.app, task_id=f"{self.id}-task{n}", content=PROMPTS[n % len(PROMPTS)]).run_id
            for n in range(self.args.runs)
        ]
        deadline = time.monotonic() + self.args.timeout
        progress = self.refresh()
        with Live(self.view(progress), console=self.console, refresh_per_second=4) as live:
            while not self.done(progress):
                if time.monotonic() > deadline:
                    self.timed_out = True
                    break
                time.sleep(0.25)
                progress = self.refresh()
                live.update(self.view(progress))
        self.console.print()
        self.progress = progress

    def refresh(self) -> Progress:
        from conveyor.platform.streams import buffer_for

        queries = _queries()
        progress = Progress()
        with self.app.pool.connection() as conn:
            progress.runs = {row[0]: row for row in conn.execute(queries["runs"], {"user_id": self.user_id})}
            progress.charges = self._totals(conn, "charges")[0]
            progress.extractions, _ = self._totals(conn, "extractions")
            progress.memories = self._totals(conn, "memories")[0]
            progress.indexed, progress.index_chunks = self._totals(conn, "indexed")
        # Read each stream as a client would: only what is new since the last look.
        buffer = buffer_for(self.app)
        for run_id in self.run_ids:
            entries = self.stream_entries.setdefault(run_id, [])
            if entries and entries[-1].kind == "end":
                continue
            entries.extend(buffer.read(run_id, entries[-1].seq if entries else 0))
        progress.chunks = sum(1 for es in self.stream_entries.values() for e in es if e.kind == "chunk")
        # Deliberate duplicates: finalize some finished rounds twice more, with no key to stop it.
        for run_id, row in progress.runs.items():
            if len(self.duplicated) >= self.duplicates_wanted:
                break
            if row[1] == "completed" and row[4] and run_id not in self.duplicated:
                task_id = self.id + "-task" + str(self.run_ids.index(run_id))
                for _ in range(2):
                    self.app.jobs.enqueue("run.finalize", {"task_id": task_id, "run_id": run_id})
                self.duplicated.add(run_id)
        return progress

    def _totals(self, conn: psycopg.Connection[TupleRow], name: str) -> tuple[Any, ...]:
        """The one row of demo.sql's aggregate query ``name`` over this demo's user."""
        row = conn.execute(_queries()[name], {"user_id": self.user_id}).fetchone()
        assert row is not None, "an aggregate query always has its row"
        return row

    def done(self, progress: Progress) -> bool:
        from conveyor.platform.records import TERMINAL

        n = self.args.runs
        if len(progress.runs) < n or any(row[1] not in TERMINAL for row in progress.runs.values()):
            return False
        if (
            len(self.duplicated) < self.duplicates_wanted
            and sum(row[1] == "completed" for row in progress.runs.values()) >= self.duplicates_wanted
        ):
            return False
        if not all(es and es[-1].kind == "end" for es in self.stream_entries.values()):
            return False
        completed = sum(row[1] == "completed" for row in progress.runs.values())
        if (progress.charges, progress.extractions, progress.indexed) != (completed,) * 3:
            return False
        counts = [self.app.broker.queue_counts(q) for q in self.app.queues]
        return all(c.waiting + c.delayed + c.active == 0 for c in counts)

    # -- the view ---------------------------------------------------------------------

    def view(self, progress: Progress) -> Group:
        from rich.console import Group
        from rich.table import Table

        table = Table(title=f"conveyor demo {self.id}", title_justify="left")
        for column in ("queue", "waiting", "delayed", "active", "completed", "failed"):
            table.add_column(column, justify="left" if column == "queue" else "right")
        for queue in self.app.queues:
            c = self.app.broker.queue_counts(queue)
            done, failed = self.baseline.get(queue, (0, 0))
            table.add_row(
                queue,
                str(c.waiting),
                str(c.delayed),
                str(c.active),
                str(c.completed_total - done),
                str(c.failed_total - failed),
            )
        runs_done = sum(row[1] == "completed" for row in progress.runs.values())
        line = (
            f"rounds {runs_done}/{self.args.runs} completed · {progress.chunks} chunks streamed · "
            f"{progress.charges} charged · {progress.extractions} extracted ({progress.memories} memories) · "
            f"{progress.indexed} indexed · {len(self.duplicated)} duplicate finalizes sent ×2"
        )
        return Group(table, line)

    # -- the checks ---------------------------------------------------------------------

    def check(self, elapsed: float) -> list[Check]:
        from rich.table import Table

        from conveyor.ledger import credits
        from conveyor.platform import records
        from conveyor.platform.faults import chosen
        from conveyor.platform.payloads import run_key

        progress = getattr(self, "progress", None) or self.refresh()
        queries = _queries()
        n = self.args.runs
        runs = progress.runs
        completed = [r for r in runs.values() if r[1] == "completed"]
        checks = [
            Check(
                "finished in time",
                not self.timed_out,
                f"{elapsed:.1f}s" + (f" (gave up after {self.args.timeout:g}s)" if self.timed_out else ""),
            )
        ]
        checks.append(Check("runs completed", len(completed) == n, f"{len(completed)}/{n}"))

        whole = 0
        with self.app.pool.connection() as conn:
            for run_id, row in runs.items():
                entries = self.stream_entries.get(run_id, [])
                reply = conn.execute(queries["reply"], {"id": row[3]}).fetchone()
                text = "".join(e.data for e in entries if e.kind == "chunk")
                if (
                    [e.seq for e in entries] == list(range(1, len(entries) + 1))
                    and entries
                    and entries[-1].kind == "end"
                    and reply
                    and reply[0] == text
                ):
                    whole += 1
            checks.append(Check("streams complete, no chunk twice, reply == stream", whole == n, f"{whole}/{n}"))
            charges = self._totals(conn, "charges")[0]
            checks.append(
                Check(
                    "charges == unique rounds",
                    charges == len(completed),
                    f"{charges} charges for {len(completed)} rounds, {2 * len(self.duplicated)} duplicate finalizes",
                )
            )
            mismatches = credits.verify(conn)
            balance = credits.balance(conn, self.user_id)
            spent = sum((e[2] for e in credits.entries(conn, self.user_id) if e[1] == "consume"), Decimal(0))
            checks.append(
                Check(
                    "balances == entries (ledger verify)",
                    not mismatches and balance == STARTING_CREDITS + spent,
                    f"{len(mismatches)} mismatches; balance {balance} = {STARTING_CREDITS} top-up {spent} charged",
                )
            )
            extractions, memories_found = self._totals(conn, "extractions")
            memories = self._totals(conn, "memories")[0]
            checks.append(
                Check(
                    "memories written",
                    extractions == len(completed) and memories > 0,
                    f"{extractions} extractions, {memories} memories",
                )
            )
            indexed, index_chunks = self._totals(conn, "indexed")
            hits = records.search_resources(conn, "task", user_id=self.user_id, limit=100)
            checks.append(
                Check(
                    "index rows written and searchable",
                    indexed == len(completed) and index_chunks > 0 and len(hits) > 0,
                    f"{indexed} resources, {index_chunks} chunks, search 'task': {len(hits)} hits",
                )
            )

        rate = self.args.fault_rate
        faulted = [rid for rid in runs if chosen(rate, run_key(rid))]
        rerun = [rid for rid in faulted if runs[rid][2] >= 2]
        checks.append(
            Check(
                "injected run faults retried and recovered",
                len(rerun) == len(faulted),
                f"{len(faulted)} runs chosen to fail once, {len(rerun)} re-ran",
            )
        )
        retries, failures = self.job_outcomes()
        checks.append(
            Check(
                "no job failed for good",
                failures == 0,
                f"{retries} retries and deferrals across all jobs, {failures} failures",
            )
        )

        table = Table(title="summary", title_justify="left")
        table.add_column("check")
        table.add_column("", justify="center")
        table.add_column("detail")
        for c in checks:
            table.add_row(c.name, "[green]ok[/]" if c.ok else "[red]FAIL[/]", c.detail)
        self.console.print(table)
        if all(c.ok for c in checks):
            self.console.print(f"[bold green]all checks passed[/] in {elapsed:.1f}s")
            self.console.print(NEXT_STEPS)
        else:
            self.console.print(
                f"[bold red]{sum(not c.ok for c in checks)} check(s) failed[/]"
                + (f"; worker logs: {self.log_path}" if self.workers else "")
            )
        return checks

    def job_outcomes(self) -> tuple[int, int]:
        """(retries and deferrals, jobs failed for good) over this demo's jobs, from the broker's records."""
        from conveyor.platform.processors.finalize import round_resource_id

        retries = failures = 0
        broker = self.app.broker
        ids = {
            self.user_id,
            *self.run_ids,
            *(round_resource_id(row[3]) for row in getattr(self, "progress", Progress()).runs.values()),
        }
        for queue in self.app.queues:
            for state in ("completed", "failed"):
                limit = 20 * self.args.runs + 100
                for record in broker.list_jobs(queue, state, limit=limit):
                    if not any(v in ids or str(v).startswith(self.id) for v in record.payload.values()):
                        continue
                    retries += max(0, record.attempts - 1)
                    failures += state == "failed"
        return retries, failures


def _queries() -> dict[str, str]:
    from conveyor.db import load_queries

    global _QUERIES
    if _QUERIES is None:
        _QUERIES = load_queries(Path(__file__).with_name("demo.sql"))
    return _QUERIES


_QUERIES: dict[str, str] | None = None

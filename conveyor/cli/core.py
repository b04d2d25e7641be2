"""migrate, worker, enqueue, status, up."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, Callable, TextIO, TypedDict

from conveyor.cli import env_flag, path_flag

if TYPE_CHECKING:
    from conveyor.app import App
    from conveyor.cli import Subcommands
    from conveyor.settings import Settings


def register(sub: Subcommands) -> None:
    p = sub.add_parser("migrate", help="apply schema/migrations once each")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("worker", help="run worker groups (one group per queue)")
    env_flag(p, "--queues", env="CONVEYOR_WORKER_QUEUES", help="comma-separated queues (default: all)")
    env_flag(p, "--processes", env="CONVEYOR_WORKER_PROCESSES", type=int, help="processes per queue")
    env_flag(
        p,
        "--threads",
        env="CONVEYOR_WORKER_THREADS",
        type=int,
        help="threads per process (default: the queue's concurrency)",
    )
    env_flag(
        p,
        "--max-jobs-per-process",
        env="CONVEYOR_WORKER_MAX_JOBS_PER_PROCESS",
        type=_count,
        help="drain a worker process after it started this many jobs and start a fresh one (0: never)",
    )
    env_flag(
        p,
        "--max-memory-per-process",
        env="CONVEYOR_WORKER_MAX_MEMORY_PER_PROCESS",
        type=_size,
        help="drain a worker process whose resident memory exceeds this (e.g. 512MiB, 1GiB) and start a "
        "fresh one (0: never)",
    )
    path_flag(p)
    env_flag(
        p,
        "--health-port",
        env="CONVEYOR_WORKER_HEALTH_PORT",
        type=int,
        help="serve /livez and /healthz (worker processes running, broker reachable) on this port, "
        "on CONVEYOR_METRICS_HOST's address; 0: none",
    )
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("enqueue", help="enqueue a job, or JSON lines from stdin with --batch")
    p.add_argument("job", nargs="?", help="job name, e.g. credit.consume")
    p.add_argument("--payload", help="the payload as JSON")
    p.add_argument("--key", help="dedup key: a second enqueue with it is a no-op")
    p.add_argument("--delay", type=float, help="seconds before the job may run")
    p.add_argument(
        "--priority",
        type=_priority,
        default=0,
        help="0 (default) to 9, higher runs first; a job overtakes lower ones ready at most "
        "priority x CONVEYOR_PRIORITY_AGING_SECONDS earlier",
    )
    p.add_argument(
        "--group",
        help="fair-share group (a tenant, e.g. user:42): the queue serves its groups round-robin "
        "and runs at most CONVEYOR_QUEUES__<QUEUE>__GROUP_CONCURRENCY jobs of one group at once",
    )
    p.add_argument(
        "--batch",
        action="store_true",
        help='read {"job", "payload", "key", "delay", "priority", "group"} JSON lines from stdin; every line is '
        "checked "
        'before any is sent, then they go in chunks, and each job\'s {"id", "deduplicated"} '
        "line is printed once its chunk is in (not when stdout is a terminal: there a bar "
        "and a summary show; elsewhere the summary is one JSON line on stderr)",
    )
    p.add_argument(
        "--chunk-size", type=int, default=500, help="--batch: jobs per round trip to the broker (default 500)"
    )
    path_flag(p)
    p.set_defaults(func=cmd_enqueue)

    p = sub.add_parser(
        "status",
        help="per-queue counts (on the embedded default: of the server `conveyor up` or a worker runs; "
        "exit 3 if none runs)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--start",
        action="store_true",
        help="embedded default: when no server runs, start it for this call (and stop it after) to read the counts",
    )
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "up",
        help="everything on one machine: worker groups for all queues, the scheduler and "
        "the API (embedded Postgres when nothing is configured)",
    )
    env_flag(p, "--processes", env="CONVEYOR_WORKER_PROCESSES", type=int, help="processes per queue")
    env_flag(p, "--host", env="CONVEYOR_API_HOST", help="API address")
    env_flag(p, "--port", env="CONVEYOR_API_PORT", type=int, help="API port (0: no API)")
    path_flag(p)
    p.set_defaults(func=cmd_up)


def _app() -> App:
    from conveyor.app import App
    from conveyor.logs import configure_logging

    app = App()
    configure_logging(app.settings.log_level, secrets=app.secret_values())
    return app


def cmd_migrate(args: argparse.Namespace) -> int:
    from conveyor.cli.progress import CommandProgress
    from conveyor.schema.migrate import migrate

    app = _app()
    if app.settings.database_url:
        url = app.settings.database_url
    else:  # not app.database_url: that migrates the embedded database before we could show it
        from conveyor.embedded import start_embedded

        url = start_embedded(app.settings.data_dir)
    with CommandProgress("migrate", summary_stream=sys.stdout) as progress:
        bar, names, done = None, [], []

        def pending(found: list[str]) -> None:
            nonlocal bar
            names.extend(found)
            bar = progress.add(_running(names, 0), total=len(names))

        def applied(name: str) -> None:
            done.append(name)
            progress.advance(bar, 1, description=_running(names, len(done)))

        try:
            migrate(url, app.blueprints, on_pending=pending, on_applied=applied)
        except BaseException:
            progress.summary(
                f"applied {len(done)} of {len(names)} migration(s), then failed",
                ok=False,
                applied=done,
                pending=names[len(done) :],
            )
            raise
        progress.summary(f"applied {len(done)} migration(s)" + (": " + ", ".join(done) if done else ""), applied=done)
    return 0


def _running(names: list[str], done: int) -> str:
    """A migrate bar's label: the migration running now."""
    return f"migrating {names[done]}" if done < len(names) else "migrated"


def _selected_queues(app: App, text: str | None) -> list[str]:
    from conveyor.errors import ConfigurationError

    if not text:
        return list(app.queues)
    queues = [q.strip() for q in text.split(",") if q.strip()]
    unknown = [q for q in queues if q not in app.queues]
    if unknown:
        raise ConfigurationError(f"unknown queue(s) {unknown}; known: {', '.join(app.queues)}")
    return queues


def cmd_worker(args: argparse.Namespace) -> int:
    from conveyor.app import run_worker_process
    from conveyor.tasks.health import broker_check
    from conveyor.tasks.worker import Supervisor, fleet_reaper

    app = _app()
    queues = _selected_queues(app, args.queues)
    if app.capabilities.in_process:
        from conveyor.errors import ConfigurationError

        raise ConfigurationError("the inline broker lives inside one process: use `conveyor up` or a real broker")
    if app.schedules and app.settings.worker_schedules:
        from conveyor.scheduling.firing import CronFirer

        CronFirer(app)  # a schedule setting that cannot work stops here, not in every child
    if app.capabilities.queue_in_postgres:
        from conveyor.schema.migrate import migrate

        migrate(app.database_url, app.blueprints)  # the embedded default must be ready before the children start
    return Supervisor(
        queues,
        args.processes,
        args.threads,
        app.settings.shutdown_timeout,
        worker=run_worker_process,
        restart_backoff=app.settings.worker_restart_backoff,
        health_port=args.health_port,
        broker_check=broker_check(app),
        max_jobs=args.max_jobs_per_process,
        max_memory=int(args.max_memory_per_process),
        on_worker_died=fleet_reaper(app),
        **_metrics_options(app.settings),
    ).run()


def _count(text: str) -> int:
    """A whole number, 0 or more."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError("give a whole number, 0 or more")
    return int(text)


def _size(text: str) -> int:
    """A ``--max-memory-per-process`` value: bytes, or a size such as 512MiB, 1GiB or 800MB."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    try:
        size = int(TypeAdapter(ByteSize).validate_python(text.strip() or 0))
    except ValidationError:
        raise argparse.ArgumentTypeError("not a size: give bytes or a number with a unit, e.g. 512MiB or 1GiB")
    if size < 0:
        raise argparse.ArgumentTypeError("a size is 0 or more")
    return size


class MetricsOptions(TypedDict):
    """The metrics settings a :class:`~conveyor.tasks.worker.Supervisor` takes as keywords."""

    metrics_port: int
    metrics_host: str
    metrics_dir: str | None


def _metrics_options(settings: Settings) -> MetricsOptions:
    return {
        "metrics_port": settings.metrics_port,
        "metrics_host": settings.metrics_host,
        "metrics_dir": str(settings.metrics_dir) if settings.metrics_dir else None,
    }


def cmd_up(args: argparse.Namespace) -> int:
    from conveyor.app import run_worker_process
    from conveyor.schema.migrate import migrate
    from conveyor.tasks.worker import Supervisor, fleet_reaper

    app = _app()
    broker = app.settings.broker_name
    where = "embedded Postgres in " + str(app.settings.data_dir) if app.settings.embedded else "configured services"
    migrate(app.database_url, app.blueprints)
    print(f"conveyor up: broker={broker}, database={where}, queues={', '.join(app.queues)}", file=sys.stderr)
    if args.port:
        print(
            f"API and dashboard: http://{args.host}:{args.port}/admin/queues "
            f"(admin {'needs CONVEYOR_ADMIN_TOKEN' if app.settings.admin_token else 'closed: set CONVEYOR_ADMIN_TOKEN'})",
            file=sys.stderr,
        )
    print("Ctrl-C or SIGTERM stops it after in-flight jobs finish.", file=sys.stderr, flush=True)
    if app.capabilities.in_process:
        import signal
        import threading

        from conveyor.cli.schedules import firers, run_firers
        from conveyor.tasks.worker import InlineWorkers

        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        workers = InlineWorkers(app).start()
        scheduler = threading.Thread(target=run_firers, args=(firers(app), stop), name="conveyor-schedulers")
        scheduler.start()
        stop.wait()
        scheduler.join()
        workers.stop()
        return 0
    from conveyor.cli.api import run_api
    from conveyor.cli.schedules import run_scheduler

    services: tuple[tuple[str, Callable[..., None], tuple[Any, ...]], ...] = (("scheduler", run_scheduler, ()),)
    if args.port:
        services += (("api", run_api, (args.host, args.port)),)
    return Supervisor(
        list(app.queues),
        args.processes,
        None,
        app.settings.shutdown_timeout,
        worker=run_worker_process,
        restart_backoff=app.settings.worker_restart_backoff,
        max_jobs=app.settings.worker_max_jobs_per_process,
        max_memory=int(app.settings.worker_max_memory_per_process),
        services=services,
        on_worker_died=fleet_reaper(app),
        **_metrics_options(app.settings),
    ).run()


def _priority(text: str) -> int:
    """``--priority``: an integer 0-9 (the error never repeats the input)."""
    from conveyor.brokers.base import MAX_PRIORITY

    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_PRIORITY:
        raise argparse.ArgumentTypeError(f"must be an integer 0-{MAX_PRIORITY}")
    return value


def cmd_enqueue(args: argparse.Namespace) -> int:
    app = _app()
    if args.batch:
        return _enqueue_batch(app, args.chunk_size)
    if not args.job or args.payload is None:
        print("conveyor: error: enqueue needs JOB and --payload (or --batch)", file=sys.stderr)
        return 2
    ref = app.jobs.enqueue(
        args.job, args.payload, key=args.key, delay=args.delay, priority=args.priority, group=args.group
    )
    print(json.dumps({"id": ref.id, "deduplicated": ref.deduplicated}))
    return 0


class _BadLine(Exception):
    """A line of an ``enqueue --batch`` input that is not a valid job."""


def _enqueue_batch(app: App, chunk_size: int) -> int:
    """``enqueue --batch``: check every line, then send them ``chunk_size`` at a time.

    Nothing is sent if any line is bad. If sending fails part way, the jobs of
    the chunks already sent are enqueued (their lines are printed, the summary
    counts them) and the rest are not, but for the chunk that failed with
    EnqueueOutcomeUnknown (``unknown``: enqueued all or none); running the file
    again is safe for keyed jobs, whose second enqueue is a no-op.
    """
    from conveyor.cli.progress import CommandProgress, is_terminal
    from conveyor.errors import ConveyorError, EnqueueOutcomeUnknown
    from conveyor.jsonchecks import json_depth_exceeds
    from conveyor.tasks.jobqueue import JobRequest

    if chunk_size < 1:
        print("conveyor: error: --chunk-size must be at least 1", file=sys.stderr)
        return 2
    print_ids = not is_terminal(sys.stdout)
    try:
        with CommandProgress("enqueue --batch") as progress:
            checking = progress.add("checking lines", total=_lines_ahead(sys.stdin) if progress.interactive else None)
            requests = []
            for n, line in enumerate(sys.stdin, 1):
                progress.advance(checking)
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    if json_depth_exceeds(row, app.settings.api_max_json_depth):
                        raise ValueError(f"nested deeper than {app.settings.api_max_json_depth} levels")
                    request = JobRequest(
                        row["job"],
                        row.get("payload"),
                        row.get("key"),
                        row.get("delay"),
                        row.get("priority", 0),
                        row.get("group"),
                    )
                    app.jobs.prepare(request)  # validated now: a bad line stops the batch before anything is sent
                except RecursionError:
                    raise _BadLine(f"line {n} is not a job: nested too deep") from None
                except (ValueError, KeyError, TypeError) as exc:
                    raise _BadLine(f"line {n} is not a job: {exc}") from None
                except ConveyorError as exc:
                    raise _BadLine(f"line {n}: {exc}") from None
                requests.append(request)
            progress.finish(checking)

            sending = progress.add("enqueueing", total=len(requests))
            enqueued = duplicates = 0
            try:
                for start in range(0, len(requests), chunk_size):
                    refs = app.jobs.enqueue_many(requests[start : start + chunk_size])
                    if print_ids:
                        sys.stdout.write(
                            "".join(json.dumps({"id": r.id, "deduplicated": r.deduplicated}) + "\n" for r in refs)
                        )
                        sys.stdout.flush()
                    enqueued += sum(not r.deduplicated for r in refs)
                    duplicates += sum(r.deduplicated for r in refs)
                    progress.advance(sending, len(refs))
            except BaseException as exc:
                # A chunk whose outcome is unknown is all in or all out: neither counted as sent nor as unsent.
                unknown = min(chunk_size, len(requests) - start) if isinstance(exc, EnqueueOutcomeUnknown) else 0
                progress.summary(
                    f"{enqueued + duplicates} of {len(requests)} jobs sent, then failed"
                    + (f" ({unknown} may have been enqueued)" if unknown else ""),
                    ok=False,
                    jobs=len(requests),
                    enqueued=enqueued,
                    deduplicated=duplicates,
                    unknown=unknown,
                    unsent=len(requests) - enqueued - duplicates - unknown,
                )
                raise
            progress.summary(
                f"{len(requests)} jobs: {enqueued} enqueued, {duplicates} deduplicated",
                jobs=len(requests),
                enqueued=enqueued,
                deduplicated=duplicates,
            )
    except _BadLine as exc:  # reported once the bar is gone, so the message is not drawn over
        print(f"conveyor: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _lines_ahead(stream: TextIO) -> int | None:
    """Lines left in ``stream`` if it is a regular file (counted without moving its offset), else None."""
    import os
    import stat

    try:
        fd = stream.fileno()
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None  # a pipe: its length is unknown until it ends
        offset, lines, last = os.lseek(fd, 0, os.SEEK_CUR), 0, b"\n"
        while block := os.pread(fd, 1 << 20, offset):
            lines, offset, last = lines + block.count(b"\n"), offset + len(block), block[-1:]
        return lines + (last != b"\n")
    except (OSError, ValueError):
        return None


#: `conveyor status`'s exit code when the embedded default's server is not running (as LSB's `status`).
NOT_RUNNING = 3


def cmd_status(args: argparse.Namespace) -> int:
    from conveyor.backends import backend_for
    from conveyor.settings import get_settings

    settings = get_settings()
    url = None
    if backend_for(settings).capabilities.queue_in_postgres and not settings.database_url and not args.start:
        # The embedded default: look in on the server `conveyor up` or a worker runs; never start one
        # (a start and a stop per call took ~3 s, and would stop nothing an operator had running).
        # Before the App is built: "nothing runs" needs neither the job modules nor the broker.
        from conveyor.embedded import running_embedded

        url = running_embedded(settings.data_dir)
        if url is None:
            print(
                f"conveyor: nothing is running: the embedded Postgres of {settings.data_dir} is stopped, so no "
                "worker is either (`conveyor up` or `conveyor worker` start it); `conveyor status --start` "
                "starts it for this call to show the counts of the jobs it keeps",
                file=sys.stderr,
            )
            return NOT_RUNNING
    app = _app()
    if url is not None:
        from conveyor.schema.migrate import migrate

        migrate(url)  # as App.database_url does for the embedded default: a no-op once up to date
        app.database_url = url
    counts = [app.broker.queue_counts(q) for q in app.queues]
    if args.json:
        print(json.dumps([{**c.__dict__, "prefetched": c.prefetched} for c in counts]))
        return 0
    print(
        f"{'queue':<12}{'waiting':>9}{'delayed':>9}{'running':>9}{'prefetched':>12}{'failed':>8}{'completed':>11}"
        f"{'paused':>8}"
    )
    for c in counts:
        print(
            f"{c.queue:<12}{c.waiting:>9}{c.delayed:>9}{c.running:>9}{c.prefetched:>12}{c.failed:>8}"
            f"{c.completed_total:>11}{'yes' if c.paused else '':>8}"
        )
    return 0

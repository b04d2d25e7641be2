"""migrate, worker, enqueue, status, up."""

from __future__ import annotations

import argparse
import json
import sys

from . import env_flag


def register(sub) -> None:
    p = sub.add_parser("migrate", help="apply ledger/migrations once each")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("worker", help="run worker groups (one group per queue)")
    env_flag(p, "--queues", env="CONVEYOR_WORKER_QUEUES", help="comma-separated queues (default: all)")
    env_flag(p, "--processes", env="CONVEYOR_WORKER_PROCESSES", type=int, default=1,
             help="processes per queue")
    env_flag(p, "--threads", env="CONVEYOR_WORKER_THREADS", type=int,
             help="threads per process (default: the queue's concurrency)")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("enqueue", help="enqueue a job, or JSON lines from stdin with --batch")
    p.add_argument("job", nargs="?", help="job name, e.g. credit.consume")
    p.add_argument("--payload", help="the payload as JSON")
    p.add_argument("--key", help="dedup key: a second enqueue with it is a no-op")
    p.add_argument("--delay", type=float, help="seconds before the job may run")
    p.add_argument("--batch", action="store_true",
                   help='read {"job", "payload", "key", "delay"} JSON lines from stdin')
    p.set_defaults(func=cmd_enqueue)

    p = sub.add_parser("status", help="per-queue counts")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("up", help="everything on one machine: worker groups for all queues, the scheduler and "
                                  "the API (embedded Postgres when nothing is configured)")
    env_flag(p, "--processes", env="CONVEYOR_WORKER_PROCESSES", type=int, default=1, help="processes per queue")
    env_flag(p, "--host", env="CONVEYOR_API_HOST", default="127.0.0.1", help="API address")
    env_flag(p, "--port", env="CONVEYOR_API_PORT", type=int, default=8000, help="API port (0: no API)")
    p.set_defaults(func=cmd_up)


def _app():
    from ..app import App
    from ..logs import configure_logging

    app = App()
    configure_logging(app.settings.log_level)
    return app


def cmd_migrate(args) -> int:
    from ..ledger.migrate import migrate

    app = _app()
    applied = migrate(app.database_url)
    print(f"applied {len(applied)} migration(s)" + (": " + ", ".join(applied) if applied else ""))
    return 0


def _selected_queues(app, text: str | None) -> list[str]:
    from ..errors import ConfigurationError

    if not text:
        return list(app.queues)
    queues = [q.strip() for q in text.split(",") if q.strip()]
    unknown = [q for q in queues if q not in app.queues]
    if unknown:
        raise ConfigurationError(f"unknown queue(s) {unknown}; known: {', '.join(app.queues)}")
    return queues


def cmd_worker(args) -> int:
    from ..tasks.worker import Supervisor

    app = _app()
    queues = _selected_queues(app, args.queues)
    if app.settings.broker_name == "inline":
        from ..errors import ConfigurationError

        raise ConfigurationError("the inline broker lives inside one process: use `conveyor up` or a real broker")
    if app.settings.broker_name == "postgres":
        from ..ledger.migrate import migrate

        migrate(app.database_url)  # the embedded default must be ready before the children start
    return Supervisor(queues, args.processes, args.threads, app.settings.shutdown_timeout,
                      **_metrics_options(app.settings)).run()


def _metrics_options(settings) -> dict:
    return {"metrics_port": settings.metrics_port, "metrics_host": settings.metrics_host,
            "metrics_dir": str(settings.metrics_dir) if settings.metrics_dir else None}


def cmd_up(args) -> int:
    from ..ledger.migrate import migrate
    from ..tasks.worker import Supervisor

    app = _app()
    broker = app.settings.broker_name
    where = "embedded Postgres in " + str(app.settings.data_dir) if app.settings.embedded else "configured services"
    migrate(app.database_url)
    print(f"conveyor up: broker={broker}, database={where}, queues={', '.join(app.queues)}", file=sys.stderr)
    if args.port:
        print(f"API and dashboard: http://{args.host}:{args.port}/admin/queues "
              f"(admin {'needs CONVEYOR_ADMIN_TOKEN' if app.settings.admin_token else 'closed: set CONVEYOR_ADMIN_TOKEN'})",
              file=sys.stderr)
    print("Ctrl-C or SIGTERM stops it after in-flight jobs finish.", file=sys.stderr, flush=True)
    if broker == "inline":
        import signal
        import threading

        from ..tasks.worker import InlineWorkers

        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        from ..scheduling.scheduler import Scheduler

        workers = InlineWorkers(app).start()
        scheduler = threading.Thread(target=Scheduler(app).run, args=(stop,), name="conveyor-scheduler")
        scheduler.start()
        stop.wait()
        scheduler.join()
        workers.stop()
        return 0
    from .api import run_api
    from .schedules import run_scheduler

    services = (("scheduler", run_scheduler, ()),)
    if args.port:
        services += (("api", run_api, (args.host, args.port)),)
    return Supervisor(list(app.queues), args.processes, None, app.settings.shutdown_timeout,
                      services=services, **_metrics_options(app.settings)).run()


def cmd_enqueue(args) -> int:
    from ..jsonchecks import json_depth_exceeds
    from ..tasks.jobqueue import JobRequest

    app = _app()
    if args.batch:
        requests = []
        for n, line in enumerate(sys.stdin, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if json_depth_exceeds(row, app.settings.api_max_json_depth):
                    raise ValueError(f"nested deeper than {app.settings.api_max_json_depth} levels")
                requests.append(JobRequest(row["job"], row.get("payload"), row.get("key"), row.get("delay")))
            except RecursionError:
                print(f"conveyor: error: line {n} is not a job: nested too deep", file=sys.stderr)
                return 2
            except (ValueError, KeyError, TypeError) as exc:
                print(f"conveyor: error: line {n} is not a job: {exc}", file=sys.stderr)
                return 2
        refs = app.jobs.enqueue_many(requests)
        for ref in refs:
            print(json.dumps({"id": ref.id, "deduplicated": ref.deduplicated}))
        return 0
    if not args.job or args.payload is None:
        print("conveyor: error: enqueue needs JOB and --payload (or --batch)", file=sys.stderr)
        return 2
    ref = app.jobs.enqueue(args.job, args.payload, key=args.key, delay=args.delay)
    print(json.dumps({"id": ref.id, "deduplicated": ref.deduplicated}))
    return 0


def cmd_status(args) -> int:
    app = _app()
    counts = [app.broker.queue_counts(q) for q in app.queues]
    if args.json:
        print(json.dumps([c.__dict__ for c in counts]))
        return 0
    print(f"{'queue':<12}{'waiting':>9}{'delayed':>9}{'active':>8}{'failed':>8}{'completed':>11}{'paused':>8}")
    for c in counts:
        print(f"{c.queue:<12}{c.waiting:>9}{c.delayed:>9}{c.active:>8}{c.failed:>8}{c.completed_total:>11}"
              f"{'yes' if c.paused else '':>8}")
    return 0

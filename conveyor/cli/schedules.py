"""conveyor scheduler, and conveyor schedules create / list / show / pause / resume / delete."""

from __future__ import annotations

import json

from conveyor.cli import env_flag


def register(sub) -> None:
    p = sub.add_parser("scheduler", help="fire due cron schedules (run as many as you like)")
    env_flag(
        p, "--interval", env="CONVEYOR_SCHEDULER_INTERVAL", type=float, help="seconds between passes over due schedules"
    )
    p.add_argument("--once", action="store_true", help="one pass, then exit (for a cron job or a check)")
    p.set_defaults(func=cmd_scheduler)

    p = sub.add_parser("schedules", help="create, list, pause, resume and delete cron schedules")
    ssub = p.add_subparsers(dest="schedules_command", metavar="ACTION", required=True)
    c = ssub.add_parser("create", help="add a schedule (cron, zone, job and payload are checked now)")
    c.add_argument("--cron", required=True, help="five-field cron expression or @daily-style alias")
    c.add_argument("--job", required=True, help="the job each fire enqueues, e.g. credit.consume")
    c.add_argument("--payload", default="{}", help="the job's payload as JSON")
    c.add_argument("--timezone", default="UTC", help="IANA zone the cron is read in (default UTC)")
    c.add_argument("--name", help="a unique name, usable instead of the id")
    c.add_argument(
        "--misfire",
        choices=("once", "skip", "all"),
        default="once",
        help="after downtime: one catch-up fire (once, default), none (skip), or each (all)",
    )
    c.add_argument("--paused", action="store_true", help="create it paused")
    c.set_defaults(func=cmd_create)
    ls = ssub.add_parser("list", help="every schedule")
    ls.add_argument("--json", action="store_true", help="print JSON lines")
    ls.set_defaults(func=cmd_list)
    for action, text in (
        ("show", "one schedule and its recent fires"),
        ("pause", "stop firing"),
        ("resume", "fire again from the next occurrence"),
        ("delete", "delete it"),
    ):
        a = ssub.add_parser(action, help=text)
        a.add_argument("schedule", help="schedule id or name")
        a.set_defaults(func=cmd_action, action=action)


def _app():
    from conveyor.app import App
    from conveyor.logs import configure_logging
    from conveyor.schema.migrate import migrate

    app = App()
    configure_logging(app.settings.log_level)
    migrate(app.database_url)
    return app


def cmd_scheduler(args) -> int:
    from conveyor.platform.scheduling.scheduler import Scheduler

    app = _app()
    if args.interval is not None:
        app.settings = app.settings.model_copy(update={"scheduler_interval": args.interval})
    if args.once:
        fired = Scheduler(app).tick()
        print(
            json.dumps(
                {
                    "fired": len([f for f in fired if not f.deduplicated]),
                    "deduplicated": len([f for f in fired if f.deduplicated]),
                }
            )
        )
        app.close()
        return 0
    _run_until_signal(app)
    return 0


def run_scheduler() -> None:
    """Fire due schedules until SIGTERM/SIGINT: the entry point of ``conveyor up``'s scheduler process."""
    from conveyor.app import App
    from conveyor.logs import configure_logging

    app = App()
    configure_logging(app.settings.log_level)
    _run_until_signal(app)


def _run_until_signal(app) -> None:
    import signal
    import threading

    from conveyor.platform.scheduling.scheduler import Scheduler

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        Scheduler(app).run(stop)
    finally:
        app.close()


def cmd_create(args) -> int:
    from conveyor.errors import InvalidSchedule
    from conveyor.platform.scheduling.schedules import Schedules

    try:
        payload = json.loads(args.payload)
    except ValueError as exc:
        raise InvalidSchedule(f"--payload is not JSON: {exc}") from None
    app = _app()
    schedule = Schedules(app).create(
        cron=args.cron,
        job=args.job,
        payload=payload,
        timezone=args.timezone,
        name=args.name,
        misfire_policy=args.misfire,
        enabled=not args.paused,
    )
    print(_json(schedule.as_dict()))
    return 0


def cmd_list(args) -> int:
    from conveyor.platform.scheduling.schedules import Schedules

    schedules = Schedules(_app()).list(limit=10_000)
    if args.json:
        for s in schedules:
            print(_json(s.as_dict()))
        return 0
    print(f"{'id':<37}{'name':<20}{'cron':<18}{'timezone':<18}{'job':<20}{'state':<8}next fire (UTC)")
    for s in schedules:
        state = "on" if s.enabled else "paused"
        print(
            f"{s.id:<37}{(s.name or '')[:19]:<20}{s.cron[:17]:<18}{s.timezone[:17]:<18}{s.job[:19]:<20}"
            f"{state:<8}{s.next_fire_at.isoformat() if s.enabled else ''}"
        )
    return 0


def cmd_action(args) -> int:
    from conveyor.platform.scheduling.schedules import Schedules

    schedules = Schedules(_app())
    if args.action == "delete":
        schedules.delete(args.schedule)
        print(f"deleted {args.schedule}")
        return 0
    schedule = getattr(schedules, {"show": "get"}.get(args.action, args.action))(args.schedule)
    out = schedule.as_dict()
    if args.action == "show":
        out["fires"] = schedules.fires(schedule.id)[-20:]
    print(_json(out))
    return 0


def _json(data) -> str:
    return json.dumps(data, default=str, sort_keys=True)

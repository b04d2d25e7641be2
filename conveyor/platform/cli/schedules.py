"""conveyor schedules create / list / show / pause / resume / delete: the agent platform's table of cron schedules.

Registered by the platform's blueprint (``jobs.add_commands``); ``conveyor scheduler`` fires them
through the firer the blueprint adds (:class:`conveyor.platform.scheduling.scheduler.Scheduler`).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.app import App
    from conveyor.cli import Subcommands


def register(sub: Subcommands) -> None:
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


def _app() -> App:
    from conveyor.app import App
    from conveyor.logs import configure_logging
    from conveyor.schema.migrate import migrate

    app = App()
    configure_logging(app.settings.log_level, secrets=app.secret_values())
    migrate(app.database_url, app.blueprints)
    return app


def cmd_create(args: argparse.Namespace) -> int:
    from conveyor.errors import InvalidSchedule
    from conveyor.platform.scheduling import schedules

    try:
        payload = json.loads(args.payload)
    except ValueError as exc:
        raise InvalidSchedule(f"--payload is not JSON: {exc}") from None
    app = _app()
    with app.pool.connection() as conn:
        schedule = schedules.create_schedule(
            conn,
            app.job_types,
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


def cmd_list(args: argparse.Namespace) -> int:
    from conveyor.platform.scheduling import schedules

    with _app().pool.connection() as conn:
        found = schedules.list_schedules(conn, limit=10_000)
    if args.json:
        for s in found:
            print(_json(s.as_dict()))
        return 0
    print(f"{'id':<37}{'name':<20}{'cron':<18}{'timezone':<18}{'job':<20}{'state':<8}next fire (UTC)")
    for s in found:
        state = "on" if s.enabled else "paused"
        print(
            f"{s.id:<37}{(s.name or '')[:19]:<20}{s.cron[:17]:<18}{s.timezone[:17]:<18}{s.job[:19]:<20}"
            f"{state:<8}{s.next_fire_at.isoformat() if s.enabled else ''}"
        )
    return 0


def cmd_action(args: argparse.Namespace) -> int:
    from conveyor.platform.scheduling import schedules

    with _app().pool.connection() as conn:
        if args.action == "delete":
            schedules.delete_schedule(conn, args.schedule)
            print(f"deleted {args.schedule}")
            return 0
        actions = {
            "show": schedules.get_schedule,
            "pause": schedules.pause_schedule,
            "resume": schedules.resume_schedule,
        }
        schedule = actions[args.action](conn, args.schedule)
        out = schedule.as_dict()
        if args.action == "show":
            out["fires"] = [f.as_dict() for f in schedules.fires(conn, schedule.id)[-20:]]
    print(_json(out))
    return 0


def _json(data: Any) -> str:
    return json.dumps(data, default=str, sort_keys=True)

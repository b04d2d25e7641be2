"""``conveyor cron add / list / pause / resume / remove``: the library's managed cron schedules (``app.cron``).

They live beside the broker's data (a Postgres table, a Redis hash), so every ``conveyor
scheduler`` and every worker that fires schedules picks a change up at its next pass. Those
declared in code (``jobs.schedule``) are listed too, read-only. (The agent platform's own
table of schedules is ``conveyor schedules``.)
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.app import App
    from conveyor.cli import Subcommands
    from conveyor.scheduling.managed import CronSchedule


def register(sub: Subcommands) -> None:
    p = sub.add_parser(
        "cron", help="add, list, pause, resume and remove cron schedules at run time (beside jobs.schedule's)"
    )
    verbs = p.add_subparsers(dest="cron_command", metavar="ACTION", required=True)
    a = verbs.add_parser("add", help="store a schedule, or replace the one of that name (everything is checked first)")
    a.add_argument("name", help="its name: a-z, 0-9, '.', '_', ':' and '-', up to 100; it keys each occurrence")
    a.add_argument("--cron", required=True, help="five-field cron expression or an alias such as @daily")
    a.add_argument("--job", required=True, help="the job each occurrence enqueues")
    a.add_argument("--payload", default="{}", help="the job's payload as a JSON object (default {})")
    a.add_argument("--timezone", default="UTC", help="IANA zone the cron is read in (default UTC)")
    a.add_argument("--paused", action="store_true", help="store it paused")
    a.set_defaults(func=cmd_add)
    ls = verbs.add_parser("list", help="every schedule, those declared in code too (read-only)")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    ls.set_defaults(func=cmd_list)
    for verb, text in (
        ("pause", "stop firing it from the next pass"),
        ("resume", "fire it again, from its next occurrence"),
        ("remove", "delete it"),
    ):
        v = verbs.add_parser(verb, help=text)
        v.add_argument("name")
        v.set_defaults(func=cmd_action, verb=verb)


def _app() -> App:
    from conveyor.app import App
    from conveyor.errors import ConfigurationError
    from conveyor.logs import configure_logging
    from conveyor.schema.migrate import migrate

    app = App()
    configure_logging(app.settings.log_level, secrets=app.secret_values())
    if app.capabilities.in_process:
        app.close()
        raise ConfigurationError(
            "the inline broker keeps schedules in its own process's memory: use app.cron in that process, "
            "or a real broker"
        )
    if app.capabilities.store == "postgres":
        migrate(app.database_url, app.blueprints)  # the table of schedules
    return app


def cmd_add(args: argparse.Namespace) -> int:
    from conveyor.errors import InvalidSchedule

    try:
        payload = json.loads(args.payload)
    except ValueError:
        raise InvalidSchedule("--payload: not JSON") from None
    app = _app()
    try:
        done = app.cron.add(
            args.name, cron=args.cron, job=args.job, payload=payload, tz=args.timezone, paused=args.paused
        )
    finally:
        app.close()
    print(_json(done))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    app = _app()
    try:
        found = app.cron.list()
    finally:
        app.close()
    if args.json:
        for s in found:
            print(_json(s))
        return 0
    print(f"{'name':<32}{'source':<9}{'cron':<18}{'timezone':<18}{'job':<24}{'state':<8}next fire (UTC)")
    for s in found:
        state = "paused" if s.paused else "on"
        upcoming = s.next_fire.isoformat() if s.next_fire else ""
        print(f"{s.name[:31]:<32}{s.source:<9}{s.cron[:17]:<18}{s.tz[:17]:<18}{s.job[:23]:<24}{state:<8}{upcoming}")
    return 0


def cmd_action(args: argparse.Namespace) -> int:
    app = _app()
    try:
        if args.verb == "remove":
            app.cron.remove(args.name)
            print(json.dumps({"removed": args.name}))
            return 0
        done = app.cron.pause(args.name) if args.verb == "pause" else app.cron.resume(args.name)
    finally:
        app.close()
    print(_json(done))
    return 0


def _json(schedule: CronSchedule) -> str:
    data: dict[str, Any] = asdict(schedule)
    return json.dumps(data, default=str, sort_keys=True)

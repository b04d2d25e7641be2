"""conveyor scheduler, and conveyor schedules create / list / show / pause / resume / delete."""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from conveyor.cli import env_flag

if TYPE_CHECKING:
    from conveyor.app import App


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "scheduler",
        help="fire due cron schedules: those declared in code (jobs.schedule) and, with the platform, "
        "its table of them (run as many as you like)",
    )
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


def _app() -> App:
    from conveyor.app import App
    from conveyor.logs import configure_logging
    from conveyor.schema.migrate import migrate

    app = App()
    configure_logging(app.settings.log_level)
    migrate(app.database_url)
    return app


#: The job the agent platform's table of schedules fires through: present when the App includes the platform.
PLATFORM_FIRE_JOB = "schedule.fire"


class Firer(Protocol):
    """What fires schedules: the library's code schedules, the platform's table of them."""

    def tick(self) -> Sequence[Any]: ...

    def run(self, stop: threading.Event) -> None: ...


def firers(app: App) -> list[Firer]:
    """Every schedule firer ``app`` needs: its code schedules', and the platform's if it includes it.

    The Postgres tables a firer needs are migrated first (nothing when only code schedules
    run on the redis or inline broker: no database is needed then).
    """
    from conveyor.scheduling.firing import CronFirer

    out: list[Firer] = [CronFirer(app)]
    if PLATFORM_FIRE_JOB in app.job_types or app.backend.queue_in_postgres:
        from conveyor.schema.migrate import migrate

        migrate(app.database_url)
    if PLATFORM_FIRE_JOB in app.job_types:
        from conveyor.platform.scheduling.scheduler import Scheduler

        out.append(Scheduler(app))
    return out


def cmd_scheduler(args: argparse.Namespace) -> int:
    from conveyor.app import App
    from conveyor.logs import configure_logging

    app = App()
    configure_logging(app.settings.log_level)
    if args.interval is not None:
        app.settings = app.settings.model_copy(update={"scheduler_interval": args.interval})
    try:
        running = firers(app)
        if args.once:
            fired = [f for firer in running for f in firer.tick()]
            new = len([f for f in fired if not f.deduplicated])
            print(json.dumps({"fired": new, "deduplicated": len(fired) - new}))
            return 0
        run_firers(running)
    finally:
        app.close()
    return 0


def run_scheduler() -> None:
    """Fire due schedules until SIGTERM/SIGINT: the entry point of ``conveyor up``'s scheduler process."""
    from conveyor.app import App
    from conveyor.logs import configure_logging

    app = App()
    configure_logging(app.settings.log_level)
    try:
        run_firers(firers(app))
    finally:
        app.close()


def run_firers(running: list[Firer], stop: threading.Event | None = None) -> None:
    """Run every firer, each in its own thread, until ``stop`` is set (by default: SIGTERM/SIGINT)."""
    if stop is None:
        import signal

        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    threads = [threading.Thread(target=f.run, args=(stop,), name="conveyor-scheduler") for f in running]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


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

"""conveyor scheduler: fires the code schedules (``jobs.schedule``), the managed ones (``conveyor cron``), and those
of every firer a blueprint adds."""

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
        help="fire due cron schedules: those declared in code (jobs.schedule), those added with `conveyor cron`, "
        "and those of the App's blueprints, such as the agent platform's table of them (run as many as you like)",
    )
    env_flag(
        p, "--interval", env="CONVEYOR_SCHEDULER_INTERVAL", type=float, help="seconds between passes over due schedules"
    )
    p.add_argument("--once", action="store_true", help="one pass, then exit (for a cron job or a check)")
    p.set_defaults(func=cmd_scheduler)


class Firer(Protocol):
    """What fires schedules: the library's code schedules, a blueprint's (the platform's table of them)."""

    def tick(self) -> Sequence[Any]: ...

    def run(self, stop: threading.Event) -> None: ...


def firers(app: App) -> list[Firer]:
    """Every schedule firer ``app`` needs: its code schedules', then those its blueprints add (``jobs.add_firer``).

    The Postgres tables a firer needs are migrated first (nothing when only code schedules
    run on the redis or inline broker: no database is needed then).
    """
    from conveyor.scheduling.firing import CronFirer

    added = [make for blueprint in app.blueprints for make in blueprint.firers]
    if added or app.capabilities.queue_in_postgres:
        from conveyor.schema.migrate import migrate

        migrate(app.database_url, app.blueprints)
    return [CronFirer(app), *(make(app) for make in added)]


def cmd_scheduler(args: argparse.Namespace) -> int:
    from conveyor.app import App
    from conveyor.logs import configure_logging

    app = App()
    configure_logging(app.settings.log_level, secrets=app.secret_values())
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
    configure_logging(app.settings.log_level, secrets=app.secret_values())
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

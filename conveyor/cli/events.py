"""``conveyor signal NAME [--data JSON]``: resume the jobs waiting for an event (``ctx.wait_for``).

Prints how many jobs the signal resumed (0: none waits yet; the signal is kept
for ``CONVEYOR_EVENT_TTL_SECONDS`` for jobs that start waiting later).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from conveyor.errors import EventError

if TYPE_CHECKING:
    from conveyor.cli import Subcommands


def register(sub: Subcommands) -> None:
    p = sub.add_parser("signal", help="signal an event: resume the jobs waiting for it (ctx.wait_for), each once")
    p.add_argument("name", metavar="NAME", help="the event's name, e.g. approval:run-7")
    p.add_argument("--data", default=None, help="the signal's data, as JSON (default: null)")
    p.add_argument("--json", action="store_true", help='print {"resumed": N}')
    p.set_defaults(func=cmd_signal)


def cmd_signal(args: argparse.Namespace) -> int:
    from conveyor.cli.core import _app

    data: Any = None
    if args.data is not None:
        try:
            data = json.loads(args.data)
        except ValueError:
            raise EventError("--data: not valid JSON") from None
    app = _app()
    try:
        resumed = app.events.signal(args.name, data)
    finally:
        app.close()
    print(json.dumps({"resumed": resumed}) if args.json else f"signalled: {resumed} job(s) resumed")
    return 0

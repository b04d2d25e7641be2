"""``conveyor workers``: every worker process, as the dashboard's Workers page shows it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import JustifyMethod

    from conveyor.cli import Subcommands


def register(sub: Subcommands) -> None:
    p = sub.add_parser("workers", help="worker processes: host, pid, queues, heartbeat, jobs in flight, counts")
    p.add_argument("--json", action="store_true", help="print JSON (one array; times are UNIX seconds)")
    p.add_argument(
        "--all", action="store_true", help="include workers that are gone (default: live and the last hour's gone)"
    )
    p.set_defaults(func=cmd_workers)


def cmd_workers(args: argparse.Namespace) -> int:
    from conveyor.cli.core import _app
    from conveyor.inspector import Inspector

    app = _app()
    try:
        workers = Inspector(app).workers()
    finally:
        app.close()
    if not args.all:
        newest_beat = max((w.heartbeat_at or 0 for w in workers), default=0)
        workers = [w for w in workers if w.state != "gone" or (w.gone_at or 0) > newest_beat - 3600]
    if args.json:
        import dataclasses

        print(json.dumps([dataclasses.asdict(w) for w in workers]))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"workers ({app.settings.broker_name} broker)", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("host", "left"),
        ("pid", "right"),
        ("state", "left"),
        ("queues", "left"),
        ("threads", "right"),
        ("started", "left"),
        ("heartbeat", "right"),
        ("running", "left"),
        ("attempts completed", "right"),
        ("attempts failed", "right"),
        ("version", "left"),
    )
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=name in ("pid", "state", "heartbeat"))
    style = {"alive": "green", "late": "bold yellow", "gone": "dim"}
    for w in workers:
        state = f"[{style[w.state]}]{w.state}[/]"
        if w.state == "gone":
            state += f" [dim]({w.gone_reason or 'gone'} {_time(w.gone_at)})[/]"
        table.add_row(
            w.host,
            str(w.pid),
            state,
            ", ".join(w.queues),
            str(w.threads),
            _time(w.started_at),
            _ago(w.heartbeat_age),
            "\n".join(w.in_flight) or "–",
            str(w.attempts_completed),
            str(w.attempts_failed),
            w.version,
        )
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 200)
    if not workers:
        console.print("no worker has registered yet (start one with `conveyor worker`)")
        return 0
    console.print(table)
    return 0


def _time(ts: float | None) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S") if ts else "–"


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    return f"{seconds:.1f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"

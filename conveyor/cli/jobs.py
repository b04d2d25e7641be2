"""``conveyor jobs`` and ``conveyor queues``: what the dashboard's operator can do, from a shell.

One job by id (``jobs show``, ``jobs retry ID…``, ``jobs delete ID…``, ``jobs promote ID…``), or many by a filter
(``--where queue=critical,state=failed,job=credit.consume,older-than=3600``): a bulk action
first counts what it will touch and asks (``--yes`` answers for scripts; off a terminal it
will not act without it), then acts job by job with a progress bar on a terminal, and ends
with one line (JSON off a terminal). Each job's state is re-checked as it is acted on, so a
job that moved on since the count is skipped, never acted on in its new state.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from conveyor.errors import InvalidQuery

if TYPE_CHECKING:
    from conveyor.cli import Subcommands
    from conveyor.inspector import Inspector, JobView, QueueView, Where

#: The one state an action applies to, implied by its --where (a filter naming another is refused).
ACTION_STATE = {"retry": "failed", "promote": "delayed"}

#: The states ``cancel --where`` may name.
CANCELLABLE = ("waiting", "delayed", "active")

#: The filter's keys, and what each becomes.
WHERE_KEYS = ("queue", "state", "job", "older-than")


def register(sub: Subcommands) -> None:
    jobs = sub.add_parser(
        "jobs", help="list, show, retry, delete, promote, cancel and purge jobs (one by id, or many --where)"
    )
    verbs = jobs.add_subparsers(dest="verb", metavar="VERB", required=True)

    p = verbs.add_parser("list", help="jobs of a queue in a state, newest first")
    _where_flag(p, required=True)
    p.add_argument("--limit", type=int, default=50, help="most jobs to print (default 50)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=cmd_list)

    p = verbs.add_parser("show", help="one job: state, attempts with their workers and errors, redacted payload")
    p.add_argument("job_id")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_show)

    for verb, what in (
        ("retry", "failed jobs back to their queue"),
        ("delete", "jobs that are not running"),
        ("promote", "delayed jobs: run them now"),
        ("cancel", "waiting, delayed or running jobs: they end cancelled"),
    ):
        p = verbs.add_parser(verb, help=f"{verb} {what}: by id, or every job --where matches")
        p.add_argument("job_ids", nargs="*", metavar="JOB_ID")
        _where_flag(p, required=False)
        _bulk_flags(p)
        p.set_defaults(func=cmd_act, action=verb)

    p = verbs.add_parser("purge", help="delete every job --where matches (e.g. completed jobs older than a day)")
    _where_flag(p, required=True)
    _bulk_flags(p)
    p.set_defaults(func=cmd_act, action="delete", job_ids=[])

    # `conveyor cancel` is `conveyor jobs cancel`: the one users reach for when a run must stop.
    p = sub.add_parser("cancel", help="cancel jobs by id, or every job --where matches (waiting, delayed or active)")
    p.add_argument("job_ids", nargs="*", metavar="JOB_ID")
    _where_flag(p, required=False)
    _bulk_flags(p)
    p.set_defaults(func=cmd_act, action="cancel")

    queues = sub.add_parser("queues", help="pause, resume or purge a queue, or weigh its groups")
    verbs = queues.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, what in (("pause", "workers stop taking its jobs"), ("resume", "workers take its jobs again")):
        p = verbs.add_parser(verb, help=what)
        p.add_argument("queue")
        p.add_argument("--json", action="store_true", help="print the queue's counts as JSON")
        p.set_defaults(func=cmd_queue, verb=verb)
    p = verbs.add_parser(
        "weight",
        help="set a fair-share group's weight: its turns per round of the queue's groups (1, the default, to 1000)",
    )
    p.add_argument("queue")
    p.add_argument("group", help="the group's name, as jobs are enqueued with it (group=...)")
    p.add_argument("weight", type=int, help="1-1000; with backlogs, weights 3, 2 and 1 get 3, 2 and 1 turns")
    p.add_argument("--json", action="store_true", help="print the queue's group weights as JSON")
    p.set_defaults(func=cmd_queue_weight)
    p = verbs.add_parser("purge", help="delete a queue's waiting jobs (or those of --state)")
    p.add_argument("queue")
    p.add_argument("--state", default="waiting", help="waiting (default), delayed, completed or failed")
    _bulk_flags(p)
    p.set_defaults(func=cmd_queue_purge)


def _where_flag(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument(
        "--where",
        required=required,
        metavar="FILTER",
        help="queue=Q,state=S[,job=NAME][,older-than=SECONDS]; retry implies state=failed, promote state=delayed; "
        "cancel takes waiting, delayed or active",
    )


def _bulk_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--yes", action="store_true", help="act without asking (needed off a terminal)")
    parser.add_argument("--json", action="store_true", help="the closing line as JSON even on a terminal")


def parse_where(text: str, *, state: str | None = None) -> Where:
    """``queue=critical,state=failed,...`` as a :class:`Where`; InvalidQuery names a bad key, never a value."""
    from conveyor.inspector import Where

    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in WHERE_KEYS:
            raise InvalidQuery(f"--where: use {', '.join(k + '=...' for k in WHERE_KEYS)}")
        fields[key] = value.strip()
    if state is not None:
        if fields.get("state", state) != state:
            raise InvalidQuery(f"--where: this action applies to {state} jobs only")
        fields["state"] = state
    if "queue" not in fields or "state" not in fields:
        raise InvalidQuery("--where: name a queue and a state (queue=Q,state=S)")
    older = fields.get("older-than")
    try:
        older_than = float(older) if older is not None else None
    except ValueError:
        raise InvalidQuery("--where: older-than is a number of seconds") from None
    if older_than is not None and older_than < 0:
        raise InvalidQuery("--where: older-than is a number of seconds")
    return Where(queue=fields["queue"], state=fields["state"], job=fields.get("job") or None, older_than=older_than)


def _inspector() -> Inspector:
    from conveyor.cli.core import _app
    from conveyor.inspector import Inspector

    return Inspector(_app())


def _plain(view: JobView | QueueView) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(view)


def cmd_list(args: argparse.Namespace) -> int:
    where = parse_where(args.where)
    inspect = _inspector()
    try:
        if where.older_than is None:  # one page, as the dashboard reads it
            jobs = inspect.jobs(where.queue, where.state, limit=max(1, args.limit), job=where.job).jobs
        else:
            jobs = inspect.select(where)
    finally:
        inspect.app.close()
    shown = jobs[: max(0, args.limit)]
    if args.json:
        for view in shown:
            print(json.dumps(_plain(view)))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{where.queue}: {where.state}, newest first", title_justify="left")
    for name in ("id", "job", "attempts", "enqueued", "error"):
        table.add_column(name, no_wrap=name == "id", overflow="fold")
    for view in shown:
        table.add_row(
            view.id,
            view.job,
            f"{view.attempts}/{view.max_attempts or '?'}",
            _when(view.enqueued_at),
            (view.error or "").splitlines()[-1][:80] if view.error else "",
        )
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    inspect = _inspector()
    try:
        view = inspect.job(args.job_id)
    finally:
        inspect.app.close()
    if args.json:
        print(json.dumps(_plain(view)))
        return 0
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 160, highlight=False)
    console.print(f"[bold]{view.id}[/]  {view.job} on {view.queue}: [bold]{view.state}[/]", markup=True)
    console.print(f"attempts {view.attempts}/{view.max_attempts or '?'}  key {view.key or '-'}", markup=False)
    console.print(f"enqueued {_when(view.enqueued_at)}  started {_when(view.started_at)}", markup=False)
    console.print(f"payload {json.dumps(view.payload)}", markup=False)
    for a in view.history:
        console.print(f"  attempt {a.attempt} on {a.worker}: {a.outcome}", markup=False)
        if a.error:
            console.print(f"    {a.error.splitlines()[-1]}", markup=False)
    if view.error and not view.history:
        console.print(view.error, markup=False)
    return 0


def cmd_act(args: argparse.Namespace) -> int:
    """retry / delete by id, or --where in bulk (purge is delete with a filter)."""
    if bool(args.job_ids) == bool(args.where):
        raise InvalidQuery(f"{args.action}: name job ids, or --where, not both")
    inspect = _inspector()
    try:
        if args.job_ids:
            ids = list(dict.fromkeys(args.job_ids))
            what = f"{len(ids)} job(s)"
        else:
            where = parse_where(args.where, state=ACTION_STATE.get(args.action))
            if args.action == "cancel" and where.state not in CANCELLABLE:
                raise InvalidQuery(f"--where: cancel applies to {', '.join(CANCELLABLE)} jobs only")
            ids = [v.id for v in inspect.select(where)]
            what = f"{len(ids)} {where.state} job(s) of queue {where.queue}" + (f" ({where.job})" if where.job else "")
        acts: dict[str, Callable[[str], object]] = {
            "retry": inspect.retry,
            "delete": inspect.delete,
            "promote": inspect.promote,
            "cancel": inspect.cancel,
        }
        act = acts[args.action]
        return _bulk(args, f"jobs {args.action}", f"{args.action} {what}", ids, act)
    finally:
        inspect.app.close()


def cmd_queue(args: argparse.Namespace) -> int:
    inspect = _inspector()
    try:
        view = inspect.pause(args.queue) if args.verb == "pause" else inspect.resume(args.queue)
    finally:
        inspect.app.close()
    if args.json:
        print(json.dumps(_plain(view)))
    else:
        print(f"queue {view.name}: {'paused' if view.paused else 'running'} ({view.waiting} waiting)")
    return 0


def cmd_queue_weight(args: argparse.Namespace) -> int:
    inspect = _inspector()
    try:
        inspect.set_group_weight(args.queue, args.group, args.weight)
        weights = inspect.app.jobs.group_weights(args.queue)
    finally:
        inspect.app.close()
    if args.json:
        print(json.dumps({"queue": args.queue, "weights": weights}))
    else:
        print(f"queue {args.queue}: group weight set to {args.weight}; weights other than 1: {len(weights)}")
    return 0


def cmd_queue_purge(args: argparse.Namespace) -> int:
    from conveyor.inspector import Where

    inspect = _inspector()
    try:
        ids = [v.id for v in inspect.select(Where(queue=args.queue, state=args.state))]
        what = f"delete {len(ids)} {args.state} job(s) of queue {args.queue}"
        return _bulk(args, "queues purge", what, ids, inspect.delete)
    finally:
        inspect.app.close()


def _bulk(args: argparse.Namespace, command: str, what: str, ids: list[str], act: Callable[[str], object]) -> int:
    """Confirm ``what`` (the count), then ``act`` on each id; a job that moved on is skipped and counted."""
    from conveyor.cli.progress import CommandProgress, is_terminal
    from conveyor.errors import AdminError

    if not ids:
        print(f"nothing to do: {what}", file=sys.stderr)
        return 0
    if not args.yes:
        if not (is_terminal(sys.stdin) and is_terminal(sys.stderr)):
            print(f"conveyor: error: would {what}; pass --yes to do it", file=sys.stderr)
            return 2
        answer = input(f"{what}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("nothing done", file=sys.stderr)
            return 1
    done = skipped = 0
    with CommandProgress(command, summary_stream=sys.stdout if args.json else sys.stderr) as progress:
        bar = progress.add(command, total=len(ids))
        for job_id in ids:
            try:
                act(job_id)
                done += 1
            except AdminError:  # gone, or no longer in the state the action needs
                skipped += 1
            progress.advance(bar)
        progress.summary(f"{command}: {done} done, {skipped} skipped", ok=True, done=done, skipped=skipped)
    return 0


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")

"""conveyor build KIND FIELDS: request a build as the operator, host paths allowed (under the source roots).

This is the one way in for sources on the build host (``archive_path``,
``source_dir``, local repositories): the HTTP API takes uploads only. The
command runs with the operator's own database and broker settings, and the
worker still takes a host path only under ``CONVEYOR_BUILD_SOURCE_ROOTS``.
Env values are read from this process's environment by name (``--env
API_KEY``), never from the command line, where ``ps`` and shell history see them.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING

from conveyor.errors import EnqueueError

if TYPE_CHECKING:
    from conveyor.cli import Subcommands


def register(sub: Subcommands) -> None:
    p = sub.add_parser("build", help="request an agent or connector build (host paths under the source roots)")
    p.add_argument("kind", help="upload, update, rollback, standalone_build, github_clone or mcp_upload")
    p.add_argument(
        "fields",
        help='the variant\'s fields as JSON, e.g. \'{"owner_id": "u1", "agent_id": "a1", '
        '"source_dir": "/srv/agents/a1"}\'',
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME",
        help="pass environment variable NAME (its value from this environment) to the build; repeatable",
    )
    p.add_argument("--build-id", help="the build's id (a repeat with the same id changes nothing)")
    p.set_defaults(func=cmd_build)


def cmd_build(args: argparse.Namespace) -> int:
    from conveyor.app import App
    from conveyor.platform.builds.requests import request_build

    try:
        fields = json.loads(args.fields)
    except ValueError:
        raise EnqueueError("fields: not JSON") from None
    if not isinstance(fields, dict):
        raise EnqueueError("fields: a JSON object")
    missing = [name for name in args.env if name not in os.environ]
    if missing:
        raise EnqueueError(f"--env: {', '.join(missing)} not set in this environment")
    app = App()
    try:
        ticket = request_build(
            app,
            args.kind,
            fields,
            env={name: os.environ[name] for name in args.env},
            build_id=args.build_id,
            host_paths=True,
        )
    finally:
        app.close()
    print(json.dumps({"build_id": ticket.build_id, "job_id": ticket.job_id, "deduplicated": ticket.deduplicated}))
    return 0

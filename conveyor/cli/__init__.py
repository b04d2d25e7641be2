"""The ``conveyor`` command. Each area adds its subcommands from its own module."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from pydantic import ValidationError

from ..errors import ConveyorError
from ..settings import env_help

#: Modules with a ``register(subparsers)`` function, in --help order.
COMMAND_MODULES = (
    "conveyor.cli.core",
    "conveyor.cli.ledger",
    "conveyor.cli.demo",
    "conveyor.cli.api",
    "conveyor.cli.schedules",
    "conveyor.cli.bench",
    "conveyor.cli.users",
)


def env_flag(parser: argparse.ArgumentParser, *flags: str, env: str, help: str, **kwargs) -> None:
    """Add a flag whose default comes from environment variable ``env``; --help names it."""
    default = os.environ.get(env, kwargs.pop("default", None))
    kind = kwargs.get("type")
    if default is not None and kind is not None and isinstance(default, str):
        default = kind(default)
    parser.add_argument(*flags, default=default, help=f"{help} [env: {env}]", **kwargs)


def build_parser() -> argparse.ArgumentParser:
    epilog = "environment:\n" + "\n".join(f"  {name:<34} {text}" for name, text in env_help())
    parser = argparse.ArgumentParser(
        prog="conveyor",
        description="Celery-style distributed jobs for AI-agent platforms.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConveyorError as exc:
        print(f"conveyor: error: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:  # the settings: each bad variable by name, never its value
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        print(f"conveyor: error: invalid settings: {problems}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130

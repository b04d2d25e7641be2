"""The ``conveyor`` command. Each area adds its subcommands from its own module."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import TYPE_CHECKING, Any, TypeAlias

from conveyor.errors import ConveyorError
from conveyor.version import __version__

# The settings (pydantic) are imported when a command runs, not to build the parser: `conveyor --help`
# and `--version` stay well under a third of a second (see conveyor.cli.envhelp for --help's epilog).
if TYPE_CHECKING:
    from pydantic_settings import BaseSettings

    #: What each command module's ``register`` adds its subcommands to.
    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

#: The library's modules with a ``register(subparsers)`` function, in --help order; the blueprints an
#: App built from the environment holds add theirs after (``jobs.add_commands``: the platform's demo).
COMMAND_MODULES = (
    "conveyor.cli.core",
    "conveyor.cli.ledger",
    "conveyor.cli.api",
    "conveyor.cli.schedules",
    "conveyor.cli.cron",
    "conveyor.cli.bench",
    "conveyor.cli.workers",
    "conveyor.cli.jobs",
    "conveyor.cli.events",
    "conveyor.cli.users",
)


class FromSettings:
    """A flag's default: the value of setting ``name``, read when the command runs (see :func:`main`).

    A plain class, not a dataclass: building the parser must not import ``dataclasses`` (and ``inspect``).
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"FromSettings({self.name!r})"


def env_flag(parser: argparse.ArgumentParser, *flags: str, env: str, help: str, **kwargs: Any) -> None:
    """Add a flag whose default is the setting behind environment variable ``env``; --help names it.

    The value comes from the settings (``CONVEYOR_WORKER_PROCESSES`` is ``Settings.worker_processes``;
    a blueprint command's own, its blueprint's settings class), never from ``os.environ`` here.
    """
    if "default" in kwargs:
        raise TypeError(f"{env}: the default of a settings flag is the Settings field's")
    # That it names a field is checked when a command runs (resolve_settings_flags) and, for every
    # flag at once, by tests/unit/test_cli_help.py: checking here would import the settings for --help.
    name = env.removeprefix("CONVEYOR_").lower()
    parser.add_argument(*flags, default=FromSettings(name), help=f"{help} [env: {env}]", **kwargs)


def resolve_settings_flags(args: argparse.Namespace, settings: BaseSettings) -> argparse.Namespace:
    """Replace every flag left at its default by its setting's value, where ``settings`` has that field.

    :func:`main` resolves the library's (:class:`~conveyor.settings.Settings`); a blueprint's command
    resolves the flags of its own settings class when it runs (the platform's ``conveyor demo --runs``),
    so a command never reads, nor checks, settings it does not use. A flag no settings class names
    is caught by tests/unit/test_cli_help.py.
    """
    for dest, value in vars(args).items():
        if isinstance(value, FromSettings) and value.name in type(settings).model_fields:
            setattr(args, dest, getattr(settings, value.name))
    return args


class _Parser(argparse.ArgumentParser):
    """The top-level parser: its epilog, every setting with its default, is made only when help is shown."""

    def format_help(self) -> str:
        if self.epilog is None:
            from conveyor.cli.envhelp import environment_help

            self.epilog = environment_help()
        return super().format_help()


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``conveyor`` parser: the library's commands, and the blueprints' unless ``argv`` names none or a
    library one (their modules, the platform's job types say, are then not imported for nothing: the
    top-level ``--help`` stays fast and says where they are). ``argv`` None: every command."""
    parser = _Parser(
        prog="conveyor",
        description="Celery-style distributed jobs for AI-agent platforms.\n\nCommands the app's blueprints "
        "bring (the bundled agent platform's demo, build and schedules) are not listed below; "
        "`conveyor COMMAND --help` shows each.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"conveyor {__version__}")
    # Plain parsers below: a subcommand's --help shows its own flags, not the environment section.
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=argparse.ArgumentParser)
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    command = None if argv is None else next((arg for arg in argv if not arg.startswith("-")), "")
    if command is None or (command and command not in sub.choices):
        for module in dict.fromkeys(m for m in blueprint_commands() if m not in COMMAND_MODULES):
            importlib.import_module(module).register(sub)
    return parser


def blueprint_commands() -> list[str]:
    """The command modules of the blueprints an App built from the environment holds.

    A blueprint module that does not import (or settings that do not validate) brings no command
    here: the command that builds the App reports why, in one line.
    """
    from conveyor.app import environment_blueprints

    return [module for blueprint in environment_blueprints() for module in blueprint.commands]


def path_flag(parser: argparse.ArgumentParser) -> None:
    """``--path DIR`` (repeatable): where CONVEYOR_IMPORTS' modules are looked for first; see :func:`main`."""
    parser.add_argument(
        "--path",
        action="append",
        metavar="DIR",
        help="directory to import CONVEYOR_IMPORTS from, before the installed packages; repeatable "
        "(default: the working directory) [env: CONVEYOR_PATH, separated by os.pathsep]",
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    from pydantic import ValidationError

    from conveyor.importing import add_paths
    from conveyor.settings import get_settings

    try:
        if getattr(args, "path", None):
            # Before the settings are first read: the App, this process's and every child's, sees them.
            os.environ["CONVEYOR_PATH"] = os.pathsep.join(os.path.abspath(p) for p in args.path)
        settings = get_settings()
        add_paths(settings.import_paths)  # spawned children inherit sys.path (and CONVEYOR_PATH) from here
        resolve_settings_flags(args, settings)
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

"""conveyor bench: run the benchmarks in ``bench/`` (a source checkout, with the ``bench`` extra installed)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conveyor.cli import Subcommands

#: The checkout's root: ``bench/`` sits beside the ``conveyor`` package, outside the distribution.
ROOT = Path(__file__).resolve().parents[2]


def _bench_available() -> bool:
    if not (ROOT / "bench" / "options.py").is_file():
        return False
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return True


def register(sub: Subcommands) -> None:
    help_text = "benchmarks against bare Dramatiq, Celery and the Postgres queues (writes bench/RESULTS.md)"
    if _bench_available():
        from bench.options import build_parser

        # The same options as `python -m bench`, parsed here.
        p = sub.add_parser(
            "bench", help=help_text, parents=[build_parser(add_help=False)], description=build_parser().description
        )
    else:
        p = sub.add_parser("bench", help=help_text)
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from conveyor.errors import ConfigurationError

    if not _bench_available():
        raise ConfigurationError(f"conveyor bench runs from a source checkout: no bench/ in {ROOT}")
    from bench.main import run_from_args

    return run_from_args(args)

"""What `conveyor --help` and `--version` tell an operator, without starting anything."""

from __future__ import annotations

import pytest

from conveyor.cli import main
from conveyor.version import __version__


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"conveyor {__version__}"


def test_help_gives_each_variable_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("  CONVEYOR_")}
    assert lines["CONVEYOR_HEARTBEAT_TIMEOUT"].endswith("[default: 60]")
    assert lines["CONVEYOR_PLATFORM"].endswith("[default: true]")
    assert lines["CONVEYOR_WORKER_RESTART_BACKOFF"].endswith("[default: 0.25]")
    # A secret has no default to show, and an unset one says nothing.
    assert "[default" not in lines["CONVEYOR_ADMIN_TOKEN"]

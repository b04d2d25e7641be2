"""What `conveyor --help` and `--version` tell an operator, without starting anything."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from conveyor.cli import FromSettings, build_parser, envhelp, main
from conveyor.settings import Settings
from conveyor.version import __version__


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    """--help's epilog cache (conveyor.cli.envhelp) in a directory of the test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


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


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_settings_flag_names_a_setting():
    # Checked here rather than when the parser is built: building it must not import the settings.
    names = [
        a.default.name for p in _parsers(build_parser()) for a in p._actions if isinstance(a.default, FromSettings)
    ]
    assert "worker_processes" in names and "demo_runs" in names
    # The library's, or the platform's own (its `conveyor demo` resolves those when it runs).
    from conveyor.platform.settings import PlatformSettings

    fields = {*Settings.model_fields, *PlatformSettings.model_fields}
    assert sorted(n for n in names if n not in fields) == []


def test_help_epilog_is_cached_and_the_cache_matches_the_settings(cache_home, capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    first = capsys.readouterr().out
    [cached] = (cache_home / "conveyor").glob("env-help-*.txt")
    header, _, text = cached.read_text().partition("\n")
    assert text == envhelp.render()
    cached.write_text(f"{header}\nenvironment:\n  CONVEYOR_FROM_THE_CACHE  x\n")
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "CONVEYOR_FROM_THE_CACHE" in capsys.readouterr().out  # read, not recomputed
    assert "CONVEYOR_HEARTBEAT_TIMEOUT" in first
    # An edit of a blueprint's settings module (its digest in the header no longer matches): recomputed.
    source, digest = header.split("\t")[1:3]
    assert source.endswith("platform/settings.py")
    cached.write_text(f"{header.replace(digest, '0' * len(digest))}\nenvironment:\n  CONVEYOR_FROM_THE_CACHE  x\n")
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "CONVEYOR_FROM_THE_CACHE" not in capsys.readouterr().out


def test_help_lists_the_platforms_variables_under_its_heading_and_only_with_the_platform(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    library, _, platform = text.partition("environment of the agent platform:")
    assert "  CONVEYOR_HEARTBEAT_TIMEOUT " in library and "CONVEYOR_PROVIDER" not in library
    for name in ("CONVEYOR_PROVIDER", "CONVEYOR_OPENAI_API_KEY", "CONVEYOR_BUILD_MEMORY_BYTES", "CONVEYOR_DEMO_RUNS"):
        assert f"  {name} " in platform
    assert "sk-" not in platform and "[default" not in platform.split("CONVEYOR_OPENAI_API_KEY")[1].split("\n")[0]
    monkeypatch.setenv("CONVEYOR_PLATFORM", "false")  # a library user's --help: no platform, none of its variables
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "CONVEYOR_HEARTBEAT_TIMEOUT" in text and "CONVEYOR_PROVIDER" not in text and "agent platform:" not in text


def test_help_cache_key_follows_the_settings_source(cache_home, monkeypatch, tmp_path):
    key = envhelp.cache_key()
    copy = tmp_path / "settings.py"
    copy.write_bytes(envhelp.SETTINGS_SOURCE.read_bytes() + b"\n# edited\n")
    monkeypatch.setattr(envhelp, "SETTINGS_SOURCE", copy)
    assert envhelp.cache_key() != key
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "elsewhere"))  # the data directory's default moves
    assert len({key, envhelp.cache_key()}) == 2


def test_help_works_where_the_cache_cannot_be_written(cache_home, capsys):
    cache_home.write_text("a file where the cache directory would be")
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "CONVEYOR_HEARTBEAT_TIMEOUT" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--help"], ["--version"]])
def test_help_and_version_import_no_pydantic_psycopg_or_dramatiq(cache_home, argv):
    """What keeps `conveyor --help` under 0.3 s: none of the heavy libraries is imported (the epilog is cached)."""
    code = (
        "import sys\n"
        "from conveyor.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'pydantic', 'pydantic_settings', 'psycopg', "
        "'dramatiq', 'rich', 'redis', 'fastapi', 'pgserver'})\n"
        "print('heavy:', ','.join(heavy), file=sys.stderr)\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True)  # fills the cache
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stderr.strip().splitlines()[-1] == "heavy:"

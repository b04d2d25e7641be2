"""compose/ and the Dockerfile keep the README's promises (issue 22, item 7), checked without a Docker daemon:
the files against the compose schema, images pinned, every command a real `conveyor` command, Prometheus'
config by promtool, Redis fsyncing every write, the data directory shared, builds able to run, and the
recipe for an image with one's own jobs loading its jobs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conveyor.version import __version__
from tests.support.harness import ROOT

COMPOSE = ROOT / "compose"
FILES = [COMPOSE / "docker-compose.yml", COMPOSE / "docker-compose.jobs.yml"]
DOCKERFILES = [ROOT / "Dockerfile", COMPOSE / "jobs-image" / "Dockerfile"]


@pytest.fixture(scope="module")
def stack() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def jobs_stack() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.jobs.yml").read_text())


def tool(name: str) -> str:
    """A command of the venv (check-jsonschema), else of the system (promtool: Debian's prometheus)."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    assert found, f"{name} is missing: `make venv` installs check-jsonschema, .ci/run installs prometheus (promtool)"
    return found


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_compose_files_match_the_compose_schema(path):
    done = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_schema_check_can_fail(tmp_path):
    broken = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    broken["services"]["redis"]["restart"] = ["always"]  # a list where the spec wants a string
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken))
    done = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        timeout=120,
    )
    assert done.returncode != 0


def test_prometheus_config_passes_promtool():
    done = subprocess.run(
        [tool("promtool"), "check", "config", str(COMPOSE / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_image_is_pinned_by_tag(stack, jobs_stack):
    images = {s["image"] for f in (stack, jobs_stack) for s in f["services"].values() if "image" in s}
    for dockerfile in DOCKERFILES:
        text = dockerfile.read_text()
        defaults = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.MULTILINE))
        for base in re.findall(r"^FROM (\S+)", text, re.MULTILINE):
            images.add(re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], base))
    for image in images:
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest" and "/" not in tag, f"{image} is not pinned by tag"
        assert re.search(r"\d", tag), f"{image}: a tag with a version"
    assert f"conveyor:{__version__}" in images  # conveyor's own image is tagged with its version


def test_every_service_command_is_a_real_conveyor_command(stack, jobs_stack):
    commands = [
        s["command"]
        for f in (stack, jobs_stack)
        for s in f["services"].values()
        if s.get("command", [""])[0] == "conveyor"
    ]
    assert len(commands) >= 10
    env = {**os.environ, "CONVEYOR_PLATFORM": "true"}
    for command in {tuple(c) for c in commands}:
        done = subprocess.run(
            [sys.executable, "-m", "conveyor", *command[1:], "--help"], capture_output=True, env=env, timeout=60
        )
        assert done.returncode == 0, (command, done.stderr[-500:])
    done = subprocess.run(
        [sys.executable, "-m", "conveyor", "no-such-command", "--help"], capture_output=True, timeout=60
    )
    assert done.returncode != 0  # the check can fail


def test_redis_fsyncs_every_write_as_the_guarantees_were_measured(stack):
    command = stack["services"]["redis"]["command"]
    flags = dict(zip(command[1::2], command[2::2]))
    assert flags == {"--appendonly": "yes", "--appendfsync": "always", "--maxmemory-policy": "noeviction"}


def test_the_data_directory_is_set_and_shared(stack):
    services = stack["services"]
    for name, service in services.items():
        if service.get("command", [""])[0] != "conveyor":
            continue
        data_dir = service["environment"]["CONVEYOR_DATA_DIR"]
        assert f"conveyor-data:{data_dir}" in service["volumes"], name
    assert "conveyor-data" in stack["volumes"]
    assert "CONVEYOR_DATA_DIR=/data" in (ROOT / "Dockerfile").read_text().replace(" ", "")


def test_builds_can_run_in_the_stack(stack):
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"apt-get install [^\n]*\bbubblewrap\b", dockerfile)
    assert "USER conveyor" in dockerfile  # the sandbox's unprivileged path: a user namespace, no capability
    builder = stack["services"]["worker-build"]  # agent.build runs on the build queue
    assert builder["command"] == ["conveyor", "worker", "--queues", "build"]
    assert set(builder["security_opt"]) == {"seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"}
    assert "cap_add" not in builder and not builder.get("privileged")
    others = [s for n, s in stack["services"].items() if n != "worker-build"]
    assert not any("security_opt" in s for s in others), "only the worker that builds gets the exemptions"


def test_the_jobs_image_recipe_loads_its_jobs(jobs_stack):
    recipe = (COMPOSE / "jobs-image" / "Dockerfile").read_text()
    assert "CONVEYOR_IMPORTS=myjobs" in recipe and "COPY --chown=conveyor:conveyor myjobs" in recipe
    code = (
        "from conveyor.app import App\n"
        "from conveyor.settings import Settings\n"
        "app = App(Settings(broker='inline'))\n"
        "assert 'reports.size' in app.job_types and app.job_types['reports.size'].queue == 'reports'\n"
        "assert 'reports' in app.queues and 'credit.consume' in app.job_types\n"
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": str(COMPOSE / "jobs-image"),
        "CONVEYOR_IMPORTS": "myjobs",
    }
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    worker = jobs_stack["services"]["worker-reports"]
    assert worker["command"] == ["conveyor", "worker", "--queues", "reports"]
    assert all(jobs_stack["services"][s]["image"] == "myjobs:1" for s in ("api", "scheduler", "worker-reports"))

"""``conveyor worker`` imports the user's job modules from where it is started (issue 19.5).

As a user runs it: the console script, from a directory holding ``myapp/``, with no
PYTHONPATH; the module is not importable from the test process or the repository.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.support.harness import env_for, make_settings
from tests.support.waiting import wait_for

CONVEYOR = str(Path(sys.executable).parent / "conveyor")

JOBS = """
from pathlib import Path

from conveyor import Payload, Queue, job

class Touch(Payload):
    name: str

@job("myapp.touch", queue=Queue("myapp"), payload=Touch)
def touch(payload: Touch, ctx) -> None:
    (Path(__file__).parent.parent / payload.name).write_text(ctx.job_id)
"""


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    package = tmp_path / f"myapp_{uuid.uuid4().hex[:8]}"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "jobs.py").write_text(textwrap.dedent(JOBS))
    return package


def user_env(settings, module: str) -> dict[str, str]:
    env = env_for(settings, CONVEYOR_PLATFORM="false", CONVEYOR_IMPORTS=module)
    env.pop("PYTHONPATH")  # a user's shell: nothing but the installed conveyor
    return env


def test_worker_started_beside_the_package_imports_it(clean_env, database_url, user_dir):
    settings = make_settings("postgres", None, database_url, queues={})
    env = user_env(settings, f"{user_dir.name}.jobs")
    worker = subprocess.Popen(
        [CONVEYOR, "worker"], cwd=user_dir.parent, env=env, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        sent = subprocess.run(
            [CONVEYOR, "enqueue", "myapp.touch", "--payload", '{"name": "done"}'],
            cwd=user_dir.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert sent.returncode == 0, sent.stderr
        done = user_dir.parent / "done"
        wait_for(done.exists, timeout=60, message="the job from myapp/ to run in the worker's child process")
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err.decode(errors="replace")[-2000:]


def test_path_flag_names_the_directory_from_anywhere(clean_env, database_url, user_dir, tmp_path_factory):
    settings = make_settings("postgres", None, database_url, queues={})
    env = user_env(settings, f"{user_dir.name}.jobs")
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    sent = subprocess.run(
        [CONVEYOR, "enqueue", "--path", str(user_dir.parent), "myapp.touch", "--payload", '{"name": "x"}'],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sent.returncode == 0, sent.stderr
    # The worker's job processes are spawned: they import from --path too, not from where it stands.
    worker = subprocess.Popen(
        [CONVEYOR, "worker", "--path", str(user_dir.parent)],
        cwd=elsewhere,
        env=env,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        ran = user_dir.parent / "x"
        wait_for(ran.exists, timeout=60, message="the job to run in a worker started elsewhere with --path")
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err.decode(errors="replace")[-2000:]


@pytest.mark.parametrize("command", [["worker"], ["enqueue", "myapp.touch", "--payload", "{}"]])
def test_a_module_not_found_is_one_line_naming_it_and_the_paths(clean_env, database_url, tmp_path, command):
    settings = make_settings("postgres", None, database_url, queues={})
    env = user_env(settings, "nothere.jobs")
    extra = str(tmp_path / "extra")
    done = subprocess.run(
        [CONVEYOR, *command, "--path", extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "'nothere.jobs'" in lines[0] and extra in lines[0]
    # Without --path the directory searched is the one the command was started in.
    done = subprocess.run([CONVEYOR, *command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "'nothere.jobs'" in done.stderr and str(tmp_path) in done.stderr


def test_a_module_that_fails_inside_names_its_own_error(clean_env, database_url, tmp_path):
    (tmp_path / "broken.py").write_text("import a_dependency_nobody_installed\n")
    settings = make_settings("postgres", None, database_url, queues={})
    env = user_env(settings, "broken")
    done = subprocess.run([CONVEYOR, "worker"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "'broken' failed to import" in done.stderr and "a_dependency_nobody_installed" in done.stderr
    assert os.path.exists(tmp_path / "broken.py")

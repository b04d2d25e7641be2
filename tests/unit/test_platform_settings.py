"""The platform's settings travel with its blueprint (issue 19.2): a library App neither needs nor checks
them, the platform's App refuses a bad one in one line naming the variable, and its secrets are scrubbed
like the library's. No servers: the inline broker."""

from __future__ import annotations

import io
import json
import logging

import pytest

from conveyor import App, JobContext, Jobs, Payload, Queue
from conveyor.cli import main
from conveyor.errors import ConfigurationError
from conveyor.logs import configure_logging
from conveyor.middleware.webhook import FailureWebhook
from conveyor.platform.settings import PlatformSettings, platform_settings
from conveyor.settings import Settings
from conveyor.tasks.worker import InlineWorkers
from tests.support.waiting import wait_for

#: Looks like a key: what a bad value must never be echoed as.
SECRETISH = "sk-not-a-provider-5521"
KEY = "sk-platform-key-scrubbed-8830"


class Add(Payload):
    a: int
    b: int


def _library_jobs() -> Jobs:
    jobs = Jobs()

    @jobs.job("math.add", queue=Queue("math"), payload=Add, store_result=True)
    def add(payload: Add, ctx: JobContext) -> int:
        return payload.a + payload.b

    return jobs


def _bad_platform_env(env: pytest.MonkeyPatch) -> None:
    env.setenv("CONVEYOR_BROKER", "inline")
    env.setenv("DATABASE_URL", "postgresql://unused/db")
    env.setenv("CONVEYOR_PROVIDER", SECRETISH)
    env.setenv("CONVEYOR_LLM_GLOBAL_CONCURRENCY", "0")
    env.setenv("CONVEYOR_BUILD_SANDBOX_UIDS", "nonsense")


def test_the_library_settings_hold_no_field_of_the_platform():
    assert not set(PlatformSettings.model_fields) & set(Settings.model_fields)
    assert {"provider", "openai_api_key", "build_memory_bytes", "user_max_streams", "fault_rate"} <= set(
        PlatformSettings.model_fields
    )


def test_a_library_app_neither_needs_nor_checks_the_platforms_variables(clean_env):
    _bad_platform_env(clean_env)
    clean_env.setenv("CONVEYOR_PLATFORM", "false")
    app = App(Settings(), jobs=[_library_jobs()])  # what `conveyor worker` builds for a library user
    workers = InlineWorkers(app).start()
    try:
        ref = app.jobs.enqueue("math.add", {"a": 20, "b": 22})
        wait_for(lambda: app.broker.get_job(ref.id).state == "completed", message="the job to complete")
        assert app.jobs.result(ref.id, timeout=5) == 42
        assert app.all_settings == [app.settings]  # the platform's were never read
    finally:
        workers.stop()
        app.close()
    # The environment's App without the platform builds too (CONVEYOR_PLATFORM=false: only the user's jobs).
    App().close()


@pytest.mark.parametrize(
    "variable, value",
    [
        ("CONVEYOR_PROVIDER", SECRETISH),
        ("CONVEYOR_USER_MAX_STREAMS", "0"),
        ("CONVEYOR_OPENAI_API_KEY", ""),  # the one value that is fine: the App builds
        ("CONVEYOR_BUILD_TIME_LIMITS__UPLOAD", "-1"),
    ],
)
def test_the_platforms_app_refuses_a_bad_platform_variable_in_one_line_naming_it_never_its_value(
    clean_env, variable, value
):
    clean_env.setenv(variable, value)
    settings = Settings(broker="inline", database_url="postgresql://unused/db")
    if variable == "CONVEYOR_OPENAI_API_KEY":
        App(settings).close()
        return
    with pytest.raises(ConfigurationError) as refused:
        App(settings)
    message = str(refused.value)
    head = variable.split("__")[0]
    assert message.startswith(f"invalid settings: {head}") and "\n" not in message, message
    if value not in ("0", "-1"):
        assert value not in message


def test_an_unknown_build_kind_is_refused_by_the_platforms_own_check(clean_env):
    clean_env.setenv("CONVEYOR_BUILD_TIME_LIMITS__NO_SUCH_KIND", "5")
    with pytest.raises(ConfigurationError, match="CONVEYOR_BUILD_TIME_LIMITS: unknown build kind"):
        App(Settings(broker="inline", database_url="postgresql://unused/db"))


def test_a_platform_command_refuses_a_bad_platform_variable_in_one_line(clean_env, capsys):
    _bad_platform_env(clean_env)
    assert main(["demo", "--runs", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("conveyor: error: invalid settings: CONVEYOR_") and "\n" not in err
    assert (
        "CONVEYOR_PROVIDER: " in err
        and "CONVEYOR_LLM_GLOBAL_CONCURRENCY" in err
        and "CONVEYOR_BUILD_SANDBOX_UIDS" in err
    )
    assert SECRETISH not in err and "nonsense" not in err


def test_the_platforms_app_reads_its_settings_from_the_environment_or_as_given(clean_env):
    clean_env.setenv("CONVEYOR_LOCAL_CHUNK_DELAY", "0.5")
    settings = Settings(broker="inline", database_url="postgresql://unused/db")
    from_env = App(settings)
    given = App(settings, blueprint_settings=[PlatformSettings(local_chunk_delay=0.25)])
    try:
        assert platform_settings(from_env).local_chunk_delay == 0.5  # the same variable names as ever
        assert platform_settings(given).local_chunk_delay == 0.25
    finally:
        from_env.close()
        given.close()


def test_the_platforms_secret_is_scrubbed_from_logs_errors_and_alerts(clean_env):
    clean_env.setenv("CONVEYOR_OPENAI_API_KEY", KEY)
    app = App(Settings(broker="inline", database_url="postgresql://unused/db"))
    try:
        config = platform_settings(app)
        assert config.openai_api_key is not None and config.openai_api_key.get_secret_value() == KEY
        assert KEY not in repr(config) and KEY not in str(config.model_dump())
        assert KEY in app.secret_values()
        # The dashboard's and the API's scrubbing read the App's settings objects, the platform's too.
        assert any(s is config for s in app.all_settings)
        webhook = next(m for m in app.build_middleware() if isinstance(m, FailureWebhook))
        assert KEY in webhook.secrets
        stream = io.StringIO()
        configure_logging("INFO", stream=stream, secrets=app.secret_values())
        logging.getLogger("conveyor.test").warning("provider said: bad key %s", KEY)
        line = json.loads(stream.getvalue().strip().splitlines()[-1])
        assert KEY not in stream.getvalue() and "[redacted]" in line["message"]
    finally:
        logging.getLogger().handlers.clear()
        app.close()

"""The App as the one composition root: it closes what it opened, dispatches conveyor's own
middleware hooks, and hands final-failure hooks the job's real attempt budget. No servers: the
inline broker, and job types set on this App only (the global registry is left alone)."""

from __future__ import annotations

from dramatiq import Message

from conveyor import App, Payload, Queue
from conveyor.appcache import per_app
from conveyor.blueprints import JobType
from conveyor.middleware.base import ConveyorMiddleware
from conveyor.settings import Settings


class Closes:
    def __init__(self, log: list, name: str) -> None:
        self.log, self.name = log, name

    def close(self) -> None:
        self.log.append(self.name)


def inline_app(**values) -> App:
    return App(Settings(broker="inline", database_url="postgresql://unused/db", **values))


def test_close_closes_every_per_app_object_newest_first():
    closed: list[str] = []
    first = per_app(lambda app: Closes(closed, "first"))
    second = per_app(lambda app: Closes(closed, "second"))
    app = inline_app()
    assert first(app) is first(app)  # one per App
    second(app)
    app.close()
    assert closed == ["second", "first"]
    assert first(app) is not None and closed == ["second", "first"]  # built anew after close, not closed twice


class Hears(ConveyorMiddleware):
    def __init__(self) -> None:
        self.dead: list[tuple[str, str]] = []

    def after_job_dead(self, broker, message, error: str) -> None:
        self.dead.append((message.message_id, error))


class Empty(Payload):
    pass


def test_final_failure_reaches_conveyor_middleware_and_gives_the_hook_the_attempt_budget():
    app = inline_app(platform=False)
    seen = []
    app.queues = {"q": Queue("q", max_attempts=7)}
    app.job_types = {
        "j": JobType(
            "j", "q", Empty, lambda p, ctx: None, on_final_failure=lambda payload, error, ctx: seen.append(ctx)
        )
    }
    hears = Hears()
    app.broker.middleware.append(hears)  # after Dramatiq's own, which have no conveyor hooks
    message = Message(queue_name="q", actor_name="j", args=({},), kwargs={}, options={"attempt": 2})
    app.final_failure(app.broker, message, "boom")
    assert hears.dead == [(message.message_id, "boom")]
    assert [(c.attempt, c.max_attempts) for c in seen] == [(2, 7)]
    app.close()


def test_a_job_without_its_own_budget_gets_its_queues_then_the_default():
    job = JobType("j", "q", Empty, lambda p, ctx: None)
    assert job.attempts(Queue("q", max_attempts=9)) == 9
    assert job.attempts(None) == 3
    assert JobType("j", "q", Empty, lambda p, ctx: None, max_attempts=2).attempts(Queue("q", max_attempts=9)) == 2


def test_cli_flags_default_to_the_settings_not_the_process_environment(clean_env, monkeypatch):
    from conveyor.cli import build_parser, resolve_settings_flags

    monkeypatch.setenv("CONVEYOR_WORKER_PROCESSES", "5")  # what os.environ says is not read here
    args = build_parser().parse_args(["worker"])
    resolve_settings_flags(args, Settings(worker_processes=3, worker_queues="critical"))
    assert (args.processes, args.queues, args.threads) == (3, "critical", None)
    args = build_parser().parse_args(["worker", "--processes", "2"])
    resolve_settings_flags(args, Settings(worker_processes=3))
    assert args.processes == 2


def test_the_demo_fault_rate_is_its_own_only_when_none_is_configured(clean_env):
    from conveyor.platform.cli.demo import DEMO_FAULT_RATE, demo_settings, worker_env
    from conveyor.platform.settings import PlatformSettings

    assert demo_settings(PlatformSettings(), None).fault_rate == DEMO_FAULT_RATE
    assert demo_settings(PlatformSettings(fault_rate=0), None).fault_rate == 0
    assert demo_settings(PlatformSettings(fault_rate=0.5), 0.1).fault_rate == 0.1
    settings = demo_settings(PlatformSettings(provider="openai"), None)
    assert settings.provider == "local" and worker_env(settings)["CONVEYOR_PROVIDER"] == "local"

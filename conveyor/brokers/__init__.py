"""How messages move: one module per backend, all behind :class:`~conveyor.brokers.base.ConveyorBroker`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dramatiq.middleware import CurrentMessage, TimeLimit

from .middleware.events import Events
from .middleware.metrics import Metrics
from .middleware.retries import Retries
from .middleware.webhook import FailureWebhook

if TYPE_CHECKING:
    from ..app import App


def build_middleware(app: "App") -> list:
    """The middleware every broker runs, in order (``after_*`` hooks run in reverse)."""
    metrics = Metrics()
    return [
        Retries(on_final_failure=app.final_failure),
        TimeLimit(),
        CurrentMessage(),
        Events(),
        # After Retries: a message Retries skips never reaches Metrics' before_process_message.
        metrics,
        FailureWebhook(app.settings, app.job_types, metrics),
    ]


def build_broker(app: "App"):
    """The configured broker, with conveyor's middleware and every job type declared on it."""
    from ..tasks.actors import declare_actors

    settings = app.settings
    middleware = build_middleware(app)
    name = settings.broker_name
    if name == "redis":
        from ..errors import ConfigurationError
        from .redis import RedisBroker

        if not settings.redis_url:
            raise ConfigurationError("CONVEYOR_BROKER=redis needs REDIS_URL")
        broker = RedisBroker(url=settings.redis_url, middleware=middleware, namespace=settings.redis_namespace,
                             heartbeat_timeout=settings.heartbeat_timeout, retention=settings.retention,
                             settings=settings)
    elif name == "postgres":
        from .postgres import PostgresBroker

        broker = PostgresBroker(app.database_url, middleware=middleware, settings=settings)
    else:
        from .inline import InlineBroker

        broker = InlineBroker(middleware=middleware)
    declare_actors(broker, app)
    return broker

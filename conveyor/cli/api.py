"""api: the HTTP side (admin API and dashboard, /metrics, OpenAPI) on uvicorn."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from conveyor.cli import env_flag

if TYPE_CHECKING:
    from types import FrameType

    import uvicorn
    from fastapi import FastAPI

    from conveyor.cli import Subcommands


def register(sub: Subcommands) -> None:
    p = sub.add_parser("api", help="admin API and /admin/queues dashboard, /metrics, OpenAPI (/docs)")
    env_flag(p, "--host", env="CONVEYOR_API_HOST", help="address to listen on")
    env_flag(p, "--port", env="CONVEYOR_API_PORT", type=int, help="port to listen on")
    p.set_defaults(func=cmd_api)


def cmd_api(args: argparse.Namespace) -> int:
    run_api(args.host, args.port)
    return 0


def run_api(host: str, port: int) -> None:
    """Serve the API until SIGTERM/SIGINT (also the entry point of ``conveyor up``'s API process)."""
    from conveyor.api import create_app
    from conveyor.app import App
    from conveyor.logs import configure_logging, log_event

    app = App()
    configure_logging(app.settings.log_level, secrets=app.secret_values())
    log_event(
        "api_started",
        queue=None,
        job=None,
        job_id=None,
        attempt=None,
        host=host,
        port=port,
        broker=app.settings.broker_name,
        admin="token" if app.settings.admin_token else "closed",
    )
    config = uvicorn_config(create_app(app), host, port, app.settings.trusted_proxies)
    try:
        _serve(config)
    finally:
        app.close()


def uvicorn_config(asgi: FastAPI, host: str, port: int, trusted_proxies: str) -> uvicorn.Config:
    """How the API is served: X-Forwarded-For/-Proto believed only from ``CONVEYOR_TRUSTED_PROXIES``.

    uvicorn's own default believes them from 127.0.0.1 (and reads FORWARDED_ALLOW_IPS): then anyone on
    the host could claim any address to the sign-in throttle. Empty: the headers are ignored.
    """
    import uvicorn

    # Logging stays conveyor's JSON (log_config=None); no access log, as request lines carry no job ids.
    return uvicorn.Config(
        asgi,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        proxy_headers=bool(trusted_proxies),
        forwarded_allow_ips=trusted_proxies.split(",") if trusted_proxies else [],
    )


def _serve(config: uvicorn.Config) -> None:
    """Run uvicorn until SIGTERM/SIGINT; after its graceful shutdown the command exits 0.

    uvicorn re-raises the signal once it has shut down, which would make a
    clean stop look like a crash to whoever supervises it (compose, systemd).
    """
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            self._captured_signals.clear()

    Server(config).run()

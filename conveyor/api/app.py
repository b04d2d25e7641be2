"""The FastAPI application: every router of :data:`ROUTERS`, sharing one conveyor :class:`~conveyor.app.App`."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from . import errors

if TYPE_CHECKING:
    from ..app import App

#: Routers, as ``"module:attribute"``, included in this order. Adding an area
#: (agent runs, schedules) is one line here; its module defines an ``APIRouter``
#: and reaches the conveyor App through :func:`conveyor.api.deps.conveyor_app`.
ROUTERS = (
    "conveyor.api.runs:router",
    "conveyor.api.resources:router",
    "conveyor.api.schedules:router",
    "conveyor.api.builds:router",
    "conveyor.api.admin:router",
    "conveyor.api.dashboard:router",
    "conveyor.api.metrics:router",
)


def create_app(app: "App") -> FastAPI:
    """The HTTP application of ``app``. The caller owns ``app`` and closes it."""
    from .. import __version__

    api = FastAPI(
        title="conveyor",
        version=__version__,
        description="conveyor's HTTP API: admin routes (Bearer CONVEYOR_ADMIN_TOKEN), "
                    "the /admin/queues dashboard and Prometheus /metrics.",
    )
    api.state.conveyor = app
    for spec in ROUTERS:
        module, _, attribute = spec.partition(":")
        api.include_router(getattr(importlib.import_module(module), attribute))

    errors.install(api)  # every ConveyorError a route lets through: conveyor.api.errors.STATUS

    @api.exception_handler(NotImplementedError)
    async def unsupported(request: Request, exc: NotImplementedError) -> JSONResponse:
        broker = app.settings.broker_name
        return JSONResponse({"detail": f"the {broker} broker does not support this operation yet"}, status_code=501)

    @api.exception_handler(ValueError)
    async def bad_value(request: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    return api

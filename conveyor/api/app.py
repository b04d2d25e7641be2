"""The FastAPI application: the routers of the App's blueprints, then the library's :data:`ROUTERS`,
sharing one conveyor :class:`~conveyor.app.App`."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from conveyor.api import docs, errors
from conveyor.api.guard import Guard

if TYPE_CHECKING:
    from conveyor.app import App

#: The library's routers, as ``"module:attribute"``, included in this order after those the App's
#: blueprints bring (``jobs.add_router(...)``: the agent platform's runs, resources, schedules, builds).
#: Each module defines an ``APIRouter`` and reaches the App through :func:`conveyor.api.deps.conveyor_app`.
ROUTERS = (
    "conveyor.api.admin:router",
    "conveyor.api.cron:router",
    "conveyor.api.events:router",
    "conveyor.api.dashboard:router",
    "conveyor.api.metrics:router",
)

#: Longest problem text in a 4xx (a validator's message could be long).
MAX_MSG_CHARS = 300

DESCRIPTION = """conveyor's HTTP API. Who may call what:

- **Producer routes** (`/api/tasks`, `/api/runs`, `/api/resources`, `/api/builds`,
  `/api/agents/upload-and-deploy`): a user's API key,
  `Authorization: Bearer cvk_...` (`conveyor users create NAME`, then `conveyor keys create NAME`).
  A user reads and writes only their own tasks, runs, streams, resources and builds; another user's
  id answers 404, exactly as one that does not exist. `/api/builds` and the upload route also take
  the admin token.
- **Admin routes** (`/api/admin`, `/api/schedules`, the `/admin/queues` dashboard):
  `Authorization: Bearer $CONVEYOR_ADMIN_TOKEN` (the dashboard signs in with it once); closed (403)
  when no admin token is configured. No user key opens them.
- **`/api/events/{name}`** (signal a waiting job): the admin token, or a user's API key for event
  names under `user:<their user id>:` only.
- **`/metrics`**: open, as Prometheus scrapes it; it holds counts and names only.

Bad input answers 4xx with `{"detail": [{"loc", "msg"}]}`, naming the field, never echoing its value.
A request with a body must carry a live credential (a user's key or the admin token), checked before
the body is read (401). A body over `CONVEYOR_API_MAX_JSON_BYTES` answers 413 (a resource's text: over
`CONVEYOR_API_MAX_BODY_BYTES`; an upload's multipart form: over `CONVEYOR_UPLOAD_MAX_BYTES`).
"""


#: Who may call each tag's routes, shown in the OpenAPI document.
TAGS = [
    {"name": "runs", "description": "Producer: a user's API key (userKey); your own tasks, runs and streams only."},
    {"name": "resources", "description": "Producer: a user's API key (userKey); your own resources only."},
    {
        "name": "builds",
        "description": "A user's API key (your own builds only) or the admin token (every build); "
        "deployments: admin token.",
    },
    {"name": "schedules", "description": "Admin token (adminToken): a schedule can enqueue any job."},
    {"name": "admin", "description": "Admin token (adminToken): queues and jobs of every user."},
    {"name": "metrics", "description": "Open: counts and names only, for Prometheus."},
    {
        "name": "events",
        "description": "Signals to waiting jobs: the admin token (any event) or a user's API key "
        "(events named user:<user id>:... only).",
    },
]


def field_errors(errors: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Validation errors as field and problem only: pydantic's ``input`` (and ``ctx``) would echo the request."""
    return [{"loc": list(err.get("loc", ())), "msg": str(err.get("msg", "invalid"))[:MAX_MSG_CHARS]} for err in errors]


def _describe_refusals(schemas: dict[str, Any]) -> None:
    """Document the 422 as this API answers it: ``{"detail": [{"loc", "msg"}]}`` (never pydantic's ``type``,
    ``input`` or ``ctx``: :func:`field_errors`), or a sentence when the problem is the request as a whole."""
    if "ValidationError" in schemas:
        field = schemas["ValidationError"]
        field["properties"] = {name: field["properties"][name] for name in ("loc", "msg")}
        field["required"] = ["loc", "msg"]
    if "HTTPValidationError" in schemas and "anyOf" not in schemas["HTTPValidationError"]["properties"]["detail"]:
        detail = schemas["HTTPValidationError"]["properties"]["detail"]
        listed = {key: detail.pop(key) for key in ("items", "type") if key in detail}
        detail["anyOf"] = [listed, {"type": "string"}]
        schemas["HTTPValidationError"]["required"] = ["detail"]


#: A refusal's body, as every 4xx of this API has it.
_PROBLEM = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}}}


def _add_common_answers(operation: dict[str, Any]) -> None:
    """Document on each operation the answers every route may give, unless the route describes them itself:
    the Guard's refusals (a NUL, a body too large, too deep or without credentials), the credentials' 401,
    and the 404 of an id in the path that names nothing of the caller's."""
    responses = operation.setdefault("responses", {})
    common = {"400": "a NUL in the path, query or body; a JSON body nested too deep or holding too many values"}
    if operation.get("security"):
        common["401"] = "no valid credentials for this route"
    if "requestBody" in operation:
        common["401"] = "no valid credentials for this route (checked before the body is read)"
        common["413"] = "the body is larger than this route takes"
    if any(parameter.get("in") == "path" for parameter in operation.get("parameters", [])):
        common["404"] = "nothing of yours by that name or id"
    for status_code, description in common.items():
        responses.setdefault(status_code, {"description": description, **_PROBLEM})


def create_app(app: "App") -> FastAPI:
    """The HTTP application of ``app``. The caller owns ``app`` and closes it."""
    from conveyor.api.dashboard import STATIC_DIR, STATIC_PATH, StaticAssets
    from conveyor.version import __version__

    # The docs page is our own (conveyor.api.docs): Swagger UI from the package, under the one CSP.
    api = FastAPI(
        title="conveyor",
        version=__version__,
        description=DESCRIPTION,
        openapi_tags=TAGS,
        docs_url=None,
        redoc_url=None,
        # Never FastAPI's exception log records (their messages could hold a secret); traces only.
        telemetry={"logs": False},
    )
    api.state.conveyor = app
    #: Upload routes: {path: cap of their multipart body}, far above CONVEYOR_API_MAX_JSON_BYTES. A router's
    #: module asks for its own with ``body_limits(app) -> dict[str, int]``, so this module names none.
    api.state.body_limits = {}
    #: Path prefixes of routes whose JSON body may be a long text (up to CONVEYOR_API_MAX_BODY_BYTES, not
    #: CONVEYOR_API_MAX_JSON_BYTES): a router's module lists them as ``LONG_TEXT_PREFIXES``.
    long_text_prefixes: list[str] = []
    for spec in dict.fromkeys([*(spec for blueprint in app.blueprints for spec in blueprint.routers), *ROUTERS]):
        module_name, _, attribute = spec.partition(":")
        module = importlib.import_module(module_name)
        api.include_router(getattr(module, attribute))
        limits = getattr(module, "body_limits", None)
        if limits is not None:
            api.state.body_limits.update(limits(app))
        long_text_prefixes.extend(getattr(module, "LONG_TEXT_PREFIXES", ()))
    # The dashboard's scripts (and any other static file there): same origin, so CSP script-src 'self' allows them.
    api.mount(STATIC_PATH, StaticAssets(directory=STATIC_DIR), name="admin-static")
    docs.install(api)
    api.add_middleware(
        Guard, conveyor=app, body_limits=api.state.body_limits, long_text_prefixes=tuple(long_text_prefixes)
    )

    if app.settings.tracing:
        # FastAPI's own OpenTelemetry support traces each request once a tracer provider is set: a request
        # joins its caller's trace (traceparent) and the jobs its route enqueues are in it.
        from conveyor.middleware.tracing import setup_tracing

        setup_tracing()

    document = api.openapi

    def openapi() -> dict[str, Any]:
        schema = document()  # made once and kept by FastAPI; patched here in place (idempotent)
        _describe_refusals(schema.get("components", {}).get("schemas", {}))
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                _add_common_answers(operation)
        return schema

    api.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to change the document

    @api.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": field_errors(exc.errors())}, status_code=422)

    # Every ConveyorError a route lets through: conveyor.api.errors.STATUS. No handler for ValueError:
    # bad input is refused by the route's models (422) or as a named ConveyorError, so a ValueError
    # that gets this far is a bug and the Guard answers it 500 with an error id.
    errors.install(api)

    return api

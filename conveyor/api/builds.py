"""/api/builds: request an agent or connector build (202) and read its outcome (admin token required).

A build request names a ``kind`` (upload, update, rollback, standalone_build,
github_clone, mcp_upload) and its fields, plus ``env``: variables whose
values are encrypted before the job is enqueued. No response ever contains
an env value, and a bad request is answered with field names only (FastAPI's
default 422 would echo the input, secrets included, so the body is
validated here instead).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, HTTPException, status

from ..builds.requests import request_build
from ..builds.store import BuildStore
from .. import records
from ..errors import EnqueueError, SecretKeyError
from .auth import Caller, require_admin, require_user_or_admin
from .deps import NamePath, conveyor_app

# A user's key asks for builds of that user's own agents and connectors and reads only that user's
# builds (owner_id); another user's answer 404 as missing ones. The admin token: any.
router = APIRouter(prefix="/api", tags=["builds"], responses={401: {"description": "no valid API key or admin token"}})


@router.post("/builds", status_code=status.HTTP_202_ACCEPTED)
def create_build(body: Any = Body(..., description="{kind, ...the variant's fields, env: {NAME: value}}"),
                 app=Depends(conveyor_app), caller: Caller = Depends(require_user_or_admin)) -> dict[str, Any]:
    if not isinstance(body, dict) or not isinstance(body.get("kind"), str):
        raise HTTPException(422, "the body is a JSON object with a 'kind'")
    fields = dict(body)
    kind, env, build_id = fields.pop("kind"), fields.pop("env", None) or {}, fields.pop("build_id", None)
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise HTTPException(422, "env maps variable names to string values")
    if caller.user_id is not None:
        if fields.setdefault("owner_id", caller.user_id) != caller.user_id:
            raise HTTPException(422, [{"loc": ["body", "owner_id"], "msg": "a build belongs to the key's user"}])
        _refuse_foreign_target(app, fields, caller.user_id)
        if isinstance(build_id, str):  # one user's client-chosen id tells another nothing
            build_id = records.scoped_id("build", caller.user_id, build_id)
    try:
        ticket = request_build(app, kind, fields, env=env, build_id=build_id)
    except SecretKeyError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc)) from None
    except EnqueueError as exc:
        raise HTTPException(422, str(exc)) from None
    return {"build_id": ticket.build_id, "job_id": ticket.job_id, "status": "queued",
            "status_url": f"/api/builds/{ticket.build_id}"}


def _refuse_foreign_target(app, fields: dict[str, Any], user_id: str) -> None:
    """404 when the build is for an agent or connector of another user (as if there were none)."""
    for kind, field in (("agent", "agent_id"), ("connector", "connector_id")):
        target_id = fields.get(field)
        if isinstance(target_id, str) and len(target_id) <= 200:
            target = BuildStore(app.pool).target(kind, target_id)
            if target is not None and target.owner_id != user_id:
                raise HTTPException(status.HTTP_404_NOT_FOUND, f"no {kind} {target_id!r}")


@router.get("/builds/{build_id}")
def get_build(build_id: NamePath, app=Depends(conveyor_app),
              caller: Caller = Depends(require_user_or_admin)) -> dict[str, Any]:
    store = BuildStore(app.pool)
    record = store.get(build_id)
    if record is not None and caller.user_id is not None and record.owner_id != caller.user_id:
        record = None  # another user's build is as missing as none
    if record is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no build {build_id!r}")
    events = [{"claim": c, "event": e, "detail": d} for c, e, d in store.events(build_id)]
    return {**record.as_dict(), "events": events}


@router.get("/deployments/{target_kind}/{target_id}", dependencies=[Depends(require_admin)])
def get_deployment(target_kind: NamePath, target_id: NamePath, app=Depends(conveyor_app)) -> dict[str, Any]:
    if target_kind not in ("agent", "connector"):
        raise HTTPException(status.HTTP_404_NOT_FOUND, "target kind is agent or connector")
    store = BuildStore(app.pool)
    target = store.target(target_kind, target_id)
    if target is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no {target_kind} {target_id!r}")
    return {"target": target.__dict__, "deployment": store.deployment(target_kind, target_id),
            "versions": [{"version": v, "artifact_sha256": a} for v, a in store.versions(target_kind, target_id)]}

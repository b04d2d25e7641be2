"""``GET /metrics``: this process's metrics (every process's, under PROMETHEUS_MULTIPROC_DIR) and queue depth.

Open like any scrape target: it holds counts and names, no payloads or secrets.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from conveyor.api.deps import ConveyorApp
from conveyor.middleware.metrics import exposition_registry

router = APIRouter(tags=["metrics"])


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(request: Request, app: ConveyorApp) -> Response:
    state = request.app.state
    if getattr(state, "metrics_registry", None) is None:
        state.metrics_registry = exposition_registry(app)
    return Response(generate_latest(state.metrics_registry), media_type=CONTENT_TYPE_LATEST)

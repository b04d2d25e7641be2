"""The interactive API docs, served from the package: no CDN, no inline script.

FastAPI's own ``/docs`` page loads Swagger UI from a CDN and boots it with an
inline script, so offline it is a blank page and it needs its own, looser
Content-Security-Policy. Here the Swagger UI bundle comes from the
``swagger-ui-bundle-v2`` wheel, the page's one script of our own is a static file
(:data:`INIT_SCRIPT`), and the page is held to the same policy as every other
(``script-src 'self'``).
"""

from __future__ import annotations

from pathlib import Path

import swagger_ui_bundle
from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

#: Where the bundle's files are served.
ASSETS_PATH = "/docs/assets"

#: The Swagger UI distribution inside the wheel (swagger-ui-bundle-v2: Swagger UI 5, which reads OpenAPI 3.1).
ASSETS_DIR = Path(swagger_ui_bundle.swagger_ui_path)

#: Our own boot script: reads the OpenAPI document's address from the page, starts Swagger UI.
INIT_SCRIPT = "/admin/static/docs-init.js"

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title} - API docs</title>
<link rel="stylesheet" href="{assets}/swagger-ui.css">
<link rel="icon" type="image/png" href="{assets}/favicon-32x32.png">
</head>
<body>
<div id="swagger-ui" data-openapi-url="{openapi}"></div>
<script src="{assets}/swagger-ui-bundle.js"></script>
<script src="{init}"></script>
</body>
</html>
"""

router = APIRouter(include_in_schema=False)


@router.get("/docs", response_class=HTMLResponse)
def docs_page() -> HTMLResponse:
    """Swagger UI for this API's OpenAPI document."""
    html = PAGE.format(title="conveyor", assets=ASSETS_PATH, openapi="/openapi.json", init=INIT_SCRIPT)
    return HTMLResponse(html, headers={"Cache-Control": "no-cache"})


def install(api: FastAPI) -> None:
    """Serve the docs page and the bundle (create the FastAPI app with ``docs_url=None, redoc_url=None``)."""
    api.include_router(router)
    api.mount(ASSETS_PATH, StaticFiles(directory=ASSETS_DIR), name="docs-assets")

"""What routes get from the request: the conveyor App and the admin read layer."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query, Request

from conveyor.app import App
from conveyor.inspector import Inspector


def conveyor_app(request: Request) -> App:
    """The conveyor App this API serves (a FastAPI dependency)."""
    app: App = request.app.state.conveyor  # starlette's State holds untyped attributes
    return app


def inspector(request: Request) -> Inspector:
    """The admin read layer on this API's App, made once per application."""
    state = request.app.state
    if getattr(state, "inspector", None) is None:
        state.inspector = Inspector(state.conveyor)
    found: Inspector = state.inspector
    return found


#: The conveyor App as a route parameter: ``app: ConveyorApp``.
ConveyorApp = Annotated[App, Depends(conveyor_app)]


#: A job id, queue or other name in a path: bounded, no control characters, so
#: a hostile one is refused (422) before it reaches a broker or an error message.
NamePath = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]
#: The same, as a query parameter.
NameQuery = Annotated[str, Query(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]
#: A page cursor as a query parameter (the read layer checks what it holds).
CursorQuery = Annotated[str | None, Query(max_length=20)]

"""What routes get from the request: the conveyor App and the admin read layer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import Request

from .inspector import Inspector

if TYPE_CHECKING:
    from ..app import App


def conveyor_app(request: Request) -> "App":
    """The conveyor App this API serves (a FastAPI dependency)."""
    return request.app.state.conveyor


def inspector(request: Request) -> Inspector:
    """The admin read layer on this API's App, made once per application."""
    state = request.app.state
    if getattr(state, "inspector", None) is None:
        state.inspector = Inspector(state.conveyor)
    return state.inspector

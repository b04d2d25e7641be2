"""conveyor's HTTP side: ``conveyor api`` serves the admin API and dashboard, ``/metrics`` and the OpenAPI spec.

:func:`~conveyor.api.app.create_app` builds the FastAPI application from
the routers the App's blueprints bring and those listed in :data:`~conveyor.api.app.ROUTERS`.
"""

from conveyor.api.app import ROUTERS, create_app

__all__ = ["ROUTERS", "create_app"]

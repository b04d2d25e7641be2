"""The one translation of conveyor's errors into HTTP statuses.

Routes raise (or let through) :class:`~conveyor.errors.ConveyorError` subclasses;
:func:`status_for` finds the status of the most specific class in the table,
walking the error's MRO, so an error class added later inherits its parent's
status until it is given its own. :func:`install` registers the handler on a
FastAPI application.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from conveyor import errors as e

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from fastapi import FastAPI, HTTPException

#: Error class -> HTTP status. The most specific class in an error's MRO wins.
STATUS: dict[type[e.ConveyorError], int] = {
    # A server behind conveyor is down: nothing was done, try again later.
    e.StoreUnavailable: 503,
    # The enqueue may have been applied and no answer came: the server's trouble, retried with a key.
    e.EnqueueOutcomeUnknown: 503,
    # The deployment cannot do this as configured (no secret key, say): not the client's fault.
    e.ConfigurationError: 503,
    e.TransactionalEnqueueUnsupported: 503,
    # The request named a job or carried a payload that cannot be enqueued.
    e.EnqueueError: 422,
    e.PayloadTooLarge: 413,
    e.ScheduleError: 422,
    e.ScheduleNotFound: 404,
    e.AdminError: 400,
    e.UnknownQueue: 404,
    e.JobNotFound: 404,
    e.JobStateConflict: 409,
    e.InvalidGroupWeight: 422,
    e.RecordNotFound: 404,
    e.RecordConflict: 409,
    e.LimitExceeded: 429,
    e.LedgerError: 409,
    e.EventError: 400,
    e.EventsUnsupported: 501,
    e.UnknownAccount: 404,
    e.ConveyorError: 500,
}


#: The answer any route may give when a store is away (every route reads or writes one): for a
#: router's ``responses``, so the OpenAPI document lists it beside the route's own.
UNAVAILABLE_RESPONSES: dict[int | str, dict[str, Any]] = {
    503: {
        "description": "the database or the broker is unavailable (try again later), or the connection broke "
        "while an enqueue committed (send it again with the same key)"
    }
}


def status_for(exc: BaseException) -> int:
    """The HTTP status of ``exc``: its most specific class in :data:`STATUS`, else 500."""
    for cls in type(exc).__mro__:
        status = STATUS.get(cls)
        if status is not None:
            return status
    return 500


def detail_for(exc: BaseException) -> str:
    """What the client is told: the error's message, or a generic line for a 500 (the log has
    the rest). A not-found error names the kind of thing only (:func:`not_found`): its message
    quotes the id asked for, and an answer never echoes input."""
    if status_for(exc) == 500:
        return "internal error"
    if isinstance(exc, e.RecordNotFound | e.ScheduleNotFound | e.JobNotFound):
        return not_found_detail(exc)
    if isinstance(exc, e.UnknownQueue):
        return f"no such queue; queues: {exc.known}" if exc.known else "no such queue"
    if isinstance(exc, e.EnqueueOutcomeUnknown):
        return "the broker did not answer the enqueue after it may have applied it: the job may exist; send it again with the same key"
    if isinstance(exc, e.StoreUnavailable):
        # The driver's line names the server's address and port: the log has it, the client need not.
        return f"{_UNAVAILABLE.get(type(exc), 'a server conveyor needs')} is unavailable; try again later"
    return str(exc)


#: The server a client is told is away, by error class.
_UNAVAILABLE: dict[type[BaseException], str] = {
    e.DatabaseUnavailable: "the database",
    e.BrokerUnavailable: "the broker",
    e.BrokerUnreachable: "the broker",
}


def not_found_detail(exc: BaseException | str) -> str:
    """``no such <kind>`` for a not-found error (``no task 'x'`` -> ``no such task``) or a kind."""
    text = exc if isinstance(exc, str) else str(exc)
    kind = text.removeprefix("no ").split(" ", 1)[0] if text.startswith("no ") else text
    return f"no such {kind}"


def not_found(what: BaseException | str) -> HTTPException:
    """The 404 a route raises for a missing (or another user's) thing, given the not-found error
    or the kind's name: the same body either way, and never the id asked for."""
    from fastapi import HTTPException

    return HTTPException(404, not_found_detail(what))


def install(api: "FastAPI") -> None:
    """Answer every :class:`~conveyor.errors.ConveyorError` a route lets through with its table status."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    @api.exception_handler(e.ConveyorError)
    async def conveyor_error(request: Request, exc: e.ConveyorError) -> JSONResponse:
        if status_for(exc) == 500:
            logger.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        elif isinstance(exc, e.StoreUnavailable | e.EnqueueOutcomeUnknown):
            logger.warning("%s %s: %s", request.method, request.url.path, exc)
        return JSONResponse({"detail": detail_for(exc)}, status_code=status_for(exc))

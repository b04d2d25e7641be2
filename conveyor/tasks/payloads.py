"""The base of every job's payload: pydantic models of IDs and values only.

A payload never holds a connection, a closure or a file handle: the worker
rebuilds what it needs from the IDs. A field added later gets a default so
messages enqueued before it still load. Unknown fields are refused at
enqueue (a typo is a bug) but tolerated at run time (a newer producer may
have added one), see :meth:`Payload.load`.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, StringConstraints

#: An identifier: non-empty, no whitespace, bounded so a key built from it fits.
Id = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:@\-]+$")]


class Payload(BaseModel):
    """Base of every payload model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Names of fields whose values are secret: redacted in logs, the dashboard and webhooks.
    secret_fields: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def load(cls, data: Any) -> "Payload":
        """Validate a payload read back from a queue, ignoring fields this version does not know."""
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if k in cls.model_fields}
        return cls.model_validate(data)

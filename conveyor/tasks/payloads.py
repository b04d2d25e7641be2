"""Every job's payload: pydantic models of IDs and values only.

A payload never holds a connection, a closure or a file handle: the worker
rebuilds what it needs from the IDs. A field added later gets a default so
messages enqueued before it still load. Unknown fields are refused at
enqueue (a typo is a bug) but tolerated at run time (a newer producer may
have added one), see :meth:`Payload.load`.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

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


class CreditConsume(Payload):
    """Charge a user for the tokens one round of a task used."""

    user_id: Id
    task_id: Id
    message_id: Id
    total_tokens: int = Field(ge=0, le=10_000_000_000)

    def idempotency_key(self) -> str:
        """The enqueue key: one charge per (task, message)."""
        return f"credit:{self.task_id}:{self.message_id}"


class TaskRun(Payload):
    """Run an agent task's round: the worker rebuilds the conversation from the IDs."""

    task_id: Id
    run_id: Id

    def idempotency_key(self) -> str:
        """The enqueue key: one job per run."""
        return f"run:{self.run_id}"


class ChatRun(TaskRun):
    """Answer the latest message of a chat: like :class:`TaskRun`, with the whole conversation as context."""


class RunFinalize(Payload):
    """End of a round: enqueue its charge, memory extraction and indexing, each once."""

    task_id: Id
    run_id: Id

    def idempotency_key(self) -> str:
        return f"finalize:{self.run_id}"


class MemoryExtraction(Payload):
    """Extract what the round taught about the user from one assistant message."""

    user_id: Id
    task_id: Id
    message_id: Id

    def idempotency_key(self) -> str:
        return f"memory:{self.task_id}:{self.message_id}"


class ResourceIndex(Payload):
    """Chunk a resource's text and index it for full-text search; the same version twice is a no-op."""

    resource_id: Id
    version: Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9]+$")]

    def idempotency_key(self) -> str:
        return f"index:{self.resource_id}:{self.version}"

"""The platform's payloads: IDs and values only (see :mod:`conveyor.tasks.payloads` for the rules)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from conveyor.tasks.payloads import Id, Payload


def run_key(run_id: str) -> str:
    """The enqueue key of a run's job (task.run / chat.run): one job per run, and the key faults are drawn by."""
    return f"run:{run_id}"


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
        return run_key(self.run_id)


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
    #: The resource's user: ids are each user's own (migration 0062). None in jobs enqueued before it,
    #: which find the resource by its id alone.
    user_id: Id | None = None

    def idempotency_key(self) -> str:
        if self.user_id is None:
            return f"index:{self.resource_id}:{self.version}"
        return f"index:{self.user_id}:{self.resource_id}:{self.version}"

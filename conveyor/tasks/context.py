"""What a processor gets besides its payload."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conveyor.app import App


@dataclass(frozen=True)
class JobContext:
    """The running job's identity and the process's resources (database pool, JobQueue)."""

    job: str
    queue: str
    job_id: str
    attempt: int
    max_attempts: int
    app: "App"

    @property
    def last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

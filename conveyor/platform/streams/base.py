"""The stream buffer interface: what every store's buffer does (see the package's docstring)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

#: Entries read per call.
READ_BATCH = 500


@dataclass(frozen=True)
class StreamEntry:
    """One entry of a run's stream: a chunk of text, or the end with the run's status in ``data``."""

    seq: int
    kind: Literal["chunk", "end"]
    data: str


class StreamBuffer(ABC):
    """A run's chunks by seq, readable from any seq, ended once."""

    @abstractmethod
    def append(self, run_id: str, seq: int, text: str) -> bool:
        """Add chunk ``seq`` (1-based) unless the buffer already holds it or has ended; True when added."""

    @abstractmethod
    def end(self, run_id: str, status: str) -> None:
        """Append the end entry (after the last chunk) unless there is one already."""

    @abstractmethod
    def read(self, run_id: str, after: int = 0, limit: int = READ_BATCH) -> list[StreamEntry]:
        """Entries with seq > ``after``, in order, at most ``limit``; no waiting."""

    def read_all(self, run_id: str) -> list[StreamEntry]:
        """Every entry of the run's stream."""
        entries: list[StreamEntry] = []
        while True:
            batch = self.read(run_id, entries[-1].seq if entries else 0)
            entries.extend(batch)
            if len(batch) < READ_BATCH:
                return entries

    def close(self) -> None:
        """Release connections; the default holds none of its own."""

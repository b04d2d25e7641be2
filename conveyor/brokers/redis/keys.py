"""Every Redis key name of the broker, once (``jobs.lua`` builds the same names; its header lists them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """Key names under one namespace."""

    ns: str

    def queue(self, name: str) -> str:
        """The list of rids waiting in a queue (``name`` may be a delay queue, ``$queue.DQ``)."""
        return f"{self.ns}:{name}"

    def messages(self, name: str) -> str:
        """Hash rid -> encoded message of a queue."""
        return f"{self.ns}:{name}.msgs"

    def acks(self, worker: str, name: str) -> str:
        """The rids ``worker`` fetched from queue ``name`` and has not settled."""
        return f"{self.ns}:__acks__.{worker}.{name}"

    @property
    def heartbeats(self) -> str:
        return f"{self.ns}:__heartbeats__"

    def job(self, job_id: str) -> str:
        """A job's record (hash)."""
        return f"{self.ns}:job:{job_id}"

    def index(self, queue: str, state: str) -> str:
        """Job ids of a queue in one state, scored by when they entered it."""
        return f"{self.ns}:idx:{queue}:{state}"

    def totals(self, queue: str) -> str:
        return f"{self.ns}:totals:{queue}"

    @property
    def paused(self) -> str:
        return f"{self.ns}:paused"

    def event(self, name: str) -> str:
        """A kept signal of event ``name`` (its resolution, with a TTL)."""
        return f"{self.ns}:event:{name}"

    def event_waiters(self, name: str) -> str:
        """Set of the job ids parked awaiting event ``name``."""
        return f"{self.ns}:event_waiters:{name}"

    def wake(self, name: str) -> str:
        """The list idle consumers of ``name`` block on."""
        return f"{self.ns}:wake:{name}"

    @property
    def cancels(self) -> str:
        """The pub/sub channel a held job's cancellation is announced on (the message: its id)."""
        return f"{self.ns}:__cancels__"

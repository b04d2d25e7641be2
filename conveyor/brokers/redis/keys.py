"""Every Redis key name of the broker, once (``jobs.lua`` builds the same names; its header lists them).

The rule for Redis Cluster, and for every key added later
---------------------------------------------------------
Every key belongs to one queue's **scope**: ``Keys.scope(queue)`` gives the
namespace its keys are built under, and ``jobs.lua`` receives that namespace
as ``KEYS[1]`` and builds every key it touches from it (``ns .. ":..."``).

* On a plain Redis (or Sentinel) the scope is the namespace itself
  (``conveyor``), so key names are exactly those of earlier releases and a
  running Redis's data stays where it was (no migration).
* On Redis Cluster the scope is ``ns{queue}`` (``conveyor{emails}``): the
  hash tag is the queue's name (its delay and dead-letter queues', too), so
  every key of a queue hashes to one slot, one script call touches one slot,
  and queues spread over the shards. Job records, dedup keys, tombstones,
  heartbeats, acks sets, the paused flag and the wake list are all per queue
  there: a job id or a dedup key is found through its queue.

So a new key is written as a method here using ``self.ns`` and, in Lua,
``ns .. ":name"``; a caller picks the scope with ``keys.scope(queue)``.
A key no queue owns (:attr:`Keys.queues`) is only ever touched by a
single-key command outside the scripts. Stores beside the broker whose
scripts touch several keys of no queue (the fleet registry, the rollups,
budgets) build them under :attr:`Keys.shared` / :func:`shared_namespace`:
the namespace on a plain Redis, ``{ns}`` on a cluster (one slot for them all).
"""

from __future__ import annotations

from dataclasses import dataclass

from dramatiq.common import q_name

from conveyor.errors import ConfigurationError


@dataclass(frozen=True)
class Keys:
    """Key names under one namespace; ``cluster``: each queue's keys carry the queue as their hash tag."""

    ns: str
    cluster: bool = False
    #: The queue this scope belongs to (cluster mode), None for the unscoped namespace.
    owner: str | None = None
    #: The unscoped namespace a scope was made from ("" for the unscoped one itself).
    base: str = ""

    def __post_init__(self) -> None:
        if self.cluster and self.owner is None and ("{" in self.ns or "}" in self.ns):
            # A brace in the namespace would become every key's hash tag: all queues on one slot, or none.
            raise ConfigurationError("the Redis namespace may not contain { or } on Redis Cluster")

    def scope(self, queue: str) -> Keys:
        """The keys of ``queue``'s scope (a delay or dead-letter queue's name maps to its queue)."""
        if not self.cluster:
            return self
        canonical = q_name(queue)
        if self.owner is not None:
            if self.owner != canonical:
                raise ValueError(f"keys of queue {self.owner!r} asked for queue {canonical!r}")
            return self
        return Keys(f"{self.ns}{{{canonical}}}", cluster=True, owner=canonical, base=self.ns)

    def queue(self, name: str) -> str:
        """The list of rids waiting in a queue (``name`` may be a delay queue, ``$queue.DQ``)."""
        return f"{self.ns}:{name}"

    def level(self, name: str, priority: int) -> str:
        """The list of rids of priority 1..9 waiting in queue ``name`` (priority 0: :meth:`queue`)."""
        return f"{self.queue(name)}.p{priority}"

    def levels(self, name: str) -> str:
        """The set of queue ``name``'s priority levels above 0 that may hold rids."""
        return f"{self.queue(name)}.levels"

    def ranks(self, name: str) -> str:
        """Hash rid -> ready_at (server ms) of the rids in queue ``name``'s levels above 0."""
        return f"{self.queue(name)}.ranks"

    def messages(self, name: str) -> str:
        """Hash rid -> encoded message of a queue."""
        return f"{self.ns}:{name}.msgs"

    def group(self, queue: str, group: str) -> str:
        """An earlier release's FIFO list of one named group's ready rids: drained first, no longer written."""
        return f"{self.ns}:group:{queue}:{group}"

    def group_ready(self, queue: str, group: str) -> str:
        """The ready rids of one named group of a queue, a sorted set by rank (jobs.lua: push_ready)."""
        return f"{self.ns}:gready:{queue}:{group}"

    def group_stamp(self, queue: str) -> str:
        """The last ready stamp (server µs) given to a job of a named group of the queue (jobs.lua: next_stamp)."""
        return f"{self.ns}:gstamp:{queue}"

    def groups(self, queue: str) -> str:
        """The ring (list) of a queue's named groups with ready jobs, plus "" for the default group's turn."""
        return f"{self.ns}:groups:{queue}"

    def group_weights(self, queue: str) -> str:
        """Hash group -> its weight (turns per round of the ring; absent: 1), set by ``set_group_weight``."""
        return f"{self.ns}:gweights:{queue}"

    def group_turn(self, queue: str) -> str:
        """Hash of the turns the group at the ring's head has taken in its round (jobs.lua: fetch)."""
        return f"{self.ns}:gturn:{queue}"

    def running(self, queue: str) -> str:
        """Hash group -> jobs of it held (active), counted against the queue's group cap."""
        return f"{self.ns}:running:{queue}"

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
        """Set of paused queue names (on a cluster, each queue's scope has its own, holding at most itself)."""
        return f"{self.ns}:paused"

    def event(self, name: str) -> str:
        """A kept signal of event ``name`` (its resolution, with a TTL)."""
        return f"{self.ns}:event:{name}"

    def event_waiters(self, name: str) -> str:
        """Set of the job ids parked awaiting event ``name``."""
        return f"{self.ns}:event_waiters:{name}"

    @property
    def enqueued(self) -> str:
        """Hash "queue\\x1fjob" -> jobs enqueued, counted by jobs.lua's enqueue (the fleet registry's totals)."""
        return f"{self.ns}:fleet:enqueued"

    def dedup(self, key: str) -> str:
        """The job id holding a dedup key (with a TTL; set by jobs.lua's enqueue)."""
        return f"{self.ns}:dedup:{key}"

    def deduplicated(self, rid: str) -> str:
        """The job id an enqueue's message ``rid`` was deduplicated to (with a TTL): a repeat of that call after a
        lost reply answers it again, though the key may have expired since (set by jobs.lua's enqueue)."""
        return f"{self.ns}:deduplicated:{rid}"

    def cancel_answer(self, call: str) -> str:
        """What the cancel call ``call`` answered (with a TTL): a repeat of that call after a lost reply answers it
        again (set by jobs.lua's cancel)."""
        return f"{self.ns}:cancel_answer:{call}"

    @property
    def shared(self) -> str:
        """The namespace of keys no queue owns that one script call touches together (see the module doc)."""
        return shared_namespace(self.base or self.ns, cluster=self.cluster)

    def wake(self, name: str) -> str:
        """The list idle consumers of ``name`` block on."""
        return f"{self.ns}:wake:{name}"

    @property
    def cancels(self) -> str:
        """The pub/sub channel a held job's cancellation is announced on (the message: its id)."""
        return f"{self.ns}:__cancels__"

    @property
    def queues(self) -> str:
        """Cluster only: the set of queue names ever enqueued to, so a job id can be looked up in each."""
        return f"{self.ns}:__queues__"


def shared_namespace(namespace: str, *, cluster: bool) -> str:
    """``namespace`` on a plain Redis (the names of earlier releases); ``{namespace}`` on a cluster: one slot."""
    return f"{{{namespace}}}" if cluster else namespace

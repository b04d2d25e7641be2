"""A Dramatiq broker on Postgres: one table is the queue (the build-worker design).

``CONVEYOR_BROKER=postgres`` (or no broker and no ``REDIS_URL``) selects it;
the table and its indexes are in ``schema/migrations/0010_jobs.sql``.

- ``jobs.py``: :class:`~.jobs.Jobs`, the one class that talks to Postgres:
  its named queries (``jobs.sql``), its pools, the translation of every
  psycopg error, claim / start / finish / retry / recover / prune and reads.
- ``broker.py``: :class:`~.broker.PostgresBroker`, Dramatiq's adapter.
- ``consumer.py``: the consumer loop (claim in batches, sleep until woken).
- ``deliveries.py``: this process's held deliveries and its outbox of outcomes.
- ``listen.py``: wake-ups from ``LISTEN`` and the worker's heartbeat.
- ``recovery.py``: dead workers' jobs, this worker's orphans, pruning.
- ``records.py``: rows as job records.

The guarantees (docs/postgres.md has them in full): every claim counts a
delivery number that only grows and survives a Postgres crash; every
start, outcome, retry and final-failure claim names its delivery and does
nothing once it is superseded; a job whose start or outcome could not be
written stays held by its worker and is handed out again, never acked.
"""

from conveyor.brokers.postgres.broker import PostgresBroker
from conveyor.brokers.postgres.jobs import CHANNEL, QUERIES, Jobs

__all__ = ["CHANNEL", "QUERIES", "Jobs", "PostgresBroker"]

"""Messages as an older producer wrote them, with fields today's code adds missing.

On Redis: no ``options.redis_message_id`` in the stored message (the queue
entry and the record still name the rid). On Postgres: no message id or
timestamp in the stored message, and no per-job attempt budget. Each must
still run to its end once, among the current producer's jobs.
"""

from __future__ import annotations

import json
import time

import psycopg
import pytest
import redis as redis_lib

from tests.faults.checker import Checker
from tests.faults.workload import Producer, enqueue_now, mixed
from tests.support.brokers import SERVER_BROKERS

FAULT = "message from an older producer, fields missing"


def age_redis_messages(cluster, job_ids: set[str]) -> int:
    """Drop ``redis_message_id`` from the stored messages of ``job_ids`` (queues, delay queues, records)."""
    ns = cluster.settings.redis_namespace
    client = redis_lib.Redis.from_url(cluster.settings.redis_url)
    changed = 0
    try:
        for key in client.scan_iter(f"{ns}:*.msgs"):
            for rid, data in client.hgetall(key).items():
                message = json.loads(data)
                if message.get("message_id") in job_ids and "redis_message_id" in message.get("options", {}):
                    del message["options"]["redis_message_id"]
                    client.hset(key, rid, json.dumps(message, separators=(",", ":")))
                    changed += 1
        for job_id in job_ids:
            record = f"{ns}:job:{job_id}"
            data = client.hget(record, "payload")
            if data:
                message = json.loads(data)
                message.get("options", {}).pop("redis_message_id", None)
                client.hset(record, "payload", json.dumps(message, separators=(",", ":")))
    finally:
        client.close()
    return changed


def age_postgres_rows(cluster, job_ids: set[str]) -> int:
    with psycopg.connect(cluster.settings.database_url, autocommit=True) as conn:
        return conn.execute(
            "UPDATE conveyor_jobs SET message = (message - 'message_id' - 'message_timestamp')"
            " || jsonb_build_object('options', '{}'::jsonb), max_attempts = NULL WHERE id = ANY(%s)",
            (sorted(job_ids),),
        ).rowcount


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_messages_from_an_older_producer_run_once(world, broker):
    cluster = world(broker, FAULT)
    old = [item for item in mixed(30, "old") if item.duplicate_of is None and item.job.startswith("fault.")]
    enqueue_now(cluster.app, old)
    ids = {item.ref_id for item in old}
    aged = age_redis_messages(cluster, ids) if broker == "redis" else age_postgres_rows(cluster, ids)
    assert aged >= len(ids) * 0.9, f"only {aged} of {len(ids)} messages were rewritten"
    groups = [cluster.start_workers(name, wait=False) for name in ("a", "b")]
    for group in groups:
        group.wait_ready()
    plan = mixed(40, "new")
    producer = Producer(cluster.app, plan, spread=2.0)
    producer.start()
    producer.wait()
    Checker(cluster, old + plan, fault=FAULT).check(time.time(), producer=producer)

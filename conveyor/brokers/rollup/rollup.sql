-- Named queries of the Postgres rollup store (postgres_store.py); tables in
-- conveyor/schema/migrations/0070_rollup.sql. Minutes are the server's.

-- name: claim_flush
INSERT INTO conveyor_rollup_flushes (id) VALUES (%(id)s) ON CONFLICT (id) DO NOTHING

-- name: add
INSERT INTO conveyor_rollup AS r (queue, minute, job, enqueued, completed, failed, retried, wait, run)
VALUES (%(queue)s, date_trunc('minute', now() - make_interval(secs => %(age)s)), %(job)s,
        %(enqueued)s, %(completed)s, %(failed)s, %(retried)s, %(wait)s, %(run)s)
ON CONFLICT (queue, minute, job) DO UPDATE
SET enqueued = r.enqueued + EXCLUDED.enqueued, completed = r.completed + EXCLUDED.completed,
    failed = r.failed + EXCLUDED.failed, retried = r.retried + EXCLUDED.retried,
    wait = conveyor_rollup_add(r.wait, EXCLUDED.wait), run = conveyor_rollup_add(r.run, EXCLUDED.run)

-- name: sample_depth
INSERT INTO conveyor_rollup AS r (queue, minute, job, depth)
VALUES (%(queue)s, date_trunc('minute', now()), '', %(depth)s)
ON CONFLICT (queue, minute, job) DO UPDATE SET depth = EXCLUDED.depth

-- name: read
SELECT extract(epoch FROM minute)::bigint, queue, job, enqueued, completed, failed, retried, wait, run, depth
FROM conveyor_rollup
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND minute >= date_trunc('minute', now() - make_interval(secs => %(seconds)s))
ORDER BY minute, queue, job

-- name: now
SELECT extract(epoch FROM now())::float8

-- name: prune
DELETE FROM conveyor_rollup WHERE minute < now() - make_interval(secs => %(keep)s)

-- name: prune_flushes
DELETE FROM conveyor_rollup_flushes WHERE at < now() - make_interval(secs => %(keep)s)

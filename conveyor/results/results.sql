-- Named queries of the Postgres result store (postgres.py); the table is in
-- conveyor/schema/migrations/0060_results.sql.

-- name: put
-- A result replaces a failure marker (an operator retried the job and it then
-- succeeded); nothing replaces a result: the first success stays.
INSERT INTO conveyor_results AS r (job_id, job, ok, value, expires_at)
VALUES (%(job_id)s, %(job)s, %(ok)s, %(value)s::json, now() + make_interval(secs => %(ttl)s))
ON CONFLICT (job_id) DO UPDATE
SET ok = true, value = EXCLUDED.value, stored_at = now(), expires_at = EXCLUDED.expires_at
WHERE NOT r.ok AND EXCLUDED.ok

-- name: notify
SELECT pg_notify('conveyor_results', %(job_id)s)

-- name: prune
-- A small batch per write keeps the table to its TTL without a sweeper.
DELETE FROM conveyor_results
WHERE job_id IN (
    SELECT job_id FROM conveyor_results WHERE expires_at < now()
    ORDER BY expires_at LIMIT 100 FOR UPDATE SKIP LOCKED
)

-- name: listen
LISTEN conveyor_results

-- name: read
SELECT ok, value::text FROM conveyor_results WHERE job_id = %(job_id)s AND expires_at > now()

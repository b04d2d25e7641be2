-- Named queries of the Postgres store of managed cron schedules (postgres.py); the table is in
-- conveyor/schema/migrations/0078_cron_schedules.sql. Each is one statement: no session state,
-- so a transaction-mode pooler (PgBouncer) may hand each its own server connection.

-- name: put
INSERT INTO conveyor_cron_schedules AS s (name, cron, tz, job, payload, paused, since)
VALUES (%(name)s, %(cron)s, %(tz)s, %(job)s, %(payload)s, %(paused)s, %(since)s)
ON CONFLICT (name) DO UPDATE
SET cron = EXCLUDED.cron, tz = EXCLUDED.tz, job = EXCLUDED.job, payload = EXCLUDED.payload,
    paused = EXCLUDED.paused, since = EXCLUDED.since, updated_at = now()

-- name: get
SELECT name, cron, tz, job, payload, paused, since FROM conveyor_cron_schedules WHERE name = %(name)s

-- name: list
SELECT name, cron, tz, job, payload, paused, since FROM conveyor_cron_schedules ORDER BY name

-- name: set_paused
UPDATE conveyor_cron_schedules
SET paused = %(paused)s, since = coalesce(%(since)s, since), updated_at = now()
WHERE name = %(name)s

-- name: delete
DELETE FROM conveyor_cron_schedules WHERE name = %(name)s

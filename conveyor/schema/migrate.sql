-- name: lock
SELECT pg_advisory_lock(%(lock)s)

-- name: unlock
SELECT pg_advisory_unlock(%(lock)s)

-- name: create_table
CREATE TABLE IF NOT EXISTS conveyor_migrations (
    name        TEXT PRIMARY KEY,
    applied_at  TIMESTAMPTZ NOT NULL DEFAULT now()
)

-- name: applied
SELECT name FROM conveyor_migrations

-- name: record
INSERT INTO conveyor_migrations (name) VALUES (%(name)s)

-- name: lock
-- Held until the end of the transaction that takes it (never a session's: see migrate.py).
SELECT pg_advisory_xact_lock(%(lock)s)

-- name: create_table
CREATE TABLE IF NOT EXISTS conveyor_migrations (
    name        TEXT PRIMARY KEY,
    applied_at  TIMESTAMPTZ NOT NULL DEFAULT now()
)

-- name: applied
SELECT name FROM conveyor_migrations

-- name: is_applied
SELECT 1 FROM conveyor_migrations WHERE name = %(name)s

-- name: record
INSERT INTO conveyor_migrations (name) VALUES (%(name)s)

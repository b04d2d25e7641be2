-- name: acquire
-- The first free slot of N, locked by this session; no row when all N are held.
-- The scan stops at the first lock taken (LIMIT 1), so at most one is taken.
SELECT slot FROM generate_series(0, %(limit)s - 1) AS slot
WHERE pg_try_advisory_lock(%(key)s, slot)
LIMIT 1

-- name: release
SELECT pg_advisory_unlock(%(key)s, %(slot)s)

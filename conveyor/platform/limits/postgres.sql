-- name: acquire
-- The first free slot of N, locked by this session; no row when all N are held.
-- The scan stops at the first lock taken (LIMIT 1), so at most one is taken.
SELECT slot FROM generate_series(0, %(limit)s - 1) AS slot
WHERE pg_try_advisory_lock(%(key)s, slot)
LIMIT 1

-- name: release
SELECT pg_advisory_unlock(%(key)s, %(slot)s)

-- name: hit
-- Count a hit in the current window; returns the window's hits and the seconds left in it.
WITH w AS (
    SELECT to_timestamp(floor(extract(epoch FROM clock_timestamp()) / %(window)s) * %(window)s) AS start
)
INSERT INTO rate_windows AS r (name, window_start, hits)
SELECT %(name)s, w.start, 1 FROM w
ON CONFLICT (name, window_start) DO UPDATE SET hits = r.hits + 1
RETURNING r.hits,
          extract(epoch FROM r.window_start - clock_timestamp()) + %(window)s

-- name: prune
DELETE FROM rate_windows WHERE name = %(name)s AND window_start < now() - interval '1 day'

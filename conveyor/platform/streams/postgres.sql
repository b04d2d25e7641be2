-- name: append
-- A seq the run already has, or a chunk after its end, adds nothing (no row returned).
-- An added chunk wakes the run's readers (LISTEN conveyor_stream, payload: the run id).
WITH added AS (
    INSERT INTO run_chunks (run_id, seq, kind, data)
    SELECT %(run_id)s, %(seq)s, 'chunk', %(data)s
    WHERE NOT EXISTS (SELECT 1 FROM run_chunks WHERE run_id = %(run_id)s AND kind = 'end')
    ON CONFLICT (run_id, seq) DO NOTHING
    RETURNING seq
)
SELECT seq, pg_notify('conveyor_stream', %(run_id)s) FROM added

-- name: end
-- After the last entry; the partial unique index run_chunks_one_end makes a second end a no-op.
WITH ended AS (
    INSERT INTO run_chunks (run_id, seq, kind, data)
    SELECT %(run_id)s, coalesce(max(seq), 0) + 1, 'end', %(data)s FROM run_chunks WHERE run_id = %(run_id)s
    ON CONFLICT DO NOTHING
    RETURNING seq
)
SELECT seq, pg_notify('conveyor_stream', %(run_id)s) FROM ended

-- name: listen
LISTEN conveyor_stream

-- name: read
SELECT seq, kind, data FROM run_chunks
WHERE run_id = %(run_id)s AND seq > %(after)s
ORDER BY seq
LIMIT %(limit)s

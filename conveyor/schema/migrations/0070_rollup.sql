-- The dashboard's charts: a per-minute rollup per queue and job type
-- (conveyor/brokers/rollup/postgres_store.py), written by every worker and
-- producer process in one batched upsert every few seconds, pruned after a day.

-- One row per (queue, minute, job). Counts add up across processes; wait and
-- run times are counts in fixed log-scale buckets (conveyor/brokers/rollup/base.py)
-- that add up element by element, so percentiles of any window can be read
-- off the sums. Rows of job '' hold the queue's depth samples.
CREATE TABLE conveyor_rollup (
    queue      TEXT NOT NULL,
    minute     TIMESTAMPTZ NOT NULL CHECK (minute = date_trunc('minute', minute)),
    job        TEXT NOT NULL,
    enqueued   BIGINT NOT NULL DEFAULT 0 CHECK (enqueued >= 0),
    completed  BIGINT NOT NULL DEFAULT 0 CHECK (completed >= 0),
    failed     BIGINT NOT NULL DEFAULT 0 CHECK (failed >= 0),
    retried    BIGINT NOT NULL DEFAULT 0 CHECK (retried >= 0),
    wait       BIGINT[] NOT NULL DEFAULT '{}',
    run        BIGINT[] NOT NULL DEFAULT '{}',
    depth      BIGINT CHECK (depth >= 0),
    PRIMARY KEY (queue, minute, job)
);

CREATE INDEX conveyor_rollup_minute ON conveyor_rollup (minute);

-- Flushes already added: a flush retried after a timeout that had in fact
-- committed is refused, not counted twice. Pruned after an hour.
CREATE TABLE conveyor_rollup_flushes (
    id  TEXT PRIMARY KEY,
    at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Element-wise sum of two histograms (the shorter one padded with zeros).
CREATE FUNCTION conveyor_rollup_add(a BIGINT[], b BIGINT[]) RETURNS BIGINT[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(array_agg(coalesce(x, 0) + coalesce(y, 0) ORDER BY i), '{}')
    FROM unnest(a, b) WITH ORDINALITY AS u(x, y, i)
$$;

-- Per-user quotas of the producer API. Active runs are counted from `runs` itself, inside the
-- transaction that creates one; the SSE streams a user holds open are leases here, renewed while
-- the stream is open and judged on the database's clock, so an API process that dies holding
-- one frees its place when the lease runs out.
CREATE TABLE stream_leases (
    id          TEXT PRIMARY KEY,
    user_id     TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL
);

CREATE INDEX stream_leases_by_user ON stream_leases (user_id, expires_at);

-- A user's live runs, found from their tasks without scanning everyone's.
CREATE INDEX runs_live_by_task ON runs (task_id) WHERE status IN ('queued', 'running');
-- A user's runs that ended within the stream retention (their streamed text is still kept).
CREATE INDEX runs_finished_by_task ON runs (task_id, finished_at) WHERE finished_at IS NOT NULL;

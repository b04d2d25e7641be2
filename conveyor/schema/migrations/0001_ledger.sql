-- The credit ledger: accounts with a balance, and an append-only list of
-- entries. A unique reference makes every charge and top-up happen once.

CREATE TABLE credit_accounts (
    user_id     TEXT PRIMARY KEY,
    balance     NUMERIC(20, 6) NOT NULL DEFAULT 0,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE credit_entries (
    id            BIGSERIAL PRIMARY KEY,
    reference_id  TEXT NOT NULL UNIQUE,
    user_id       TEXT NOT NULL REFERENCES credit_accounts (user_id),
    kind          TEXT NOT NULL CHECK (kind IN ('consume', 'top_up')),
    amount        NUMERIC(20, 6) NOT NULL,
    tokens        BIGINT CHECK (tokens >= 0),
    task_id       TEXT,
    message_id    TEXT,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- consumptions take credits away, top-ups add them.
    CONSTRAINT credit_entries_sign CHECK (
        (kind = 'consume' AND amount <= 0) OR (kind = 'top_up' AND amount > 0)
    )
);

CREATE INDEX credit_entries_by_user ON credit_entries (user_id, id);

-- Entries are history: never changed, never removed.
CREATE FUNCTION credit_entries_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'credit_entries is append-only (% refused)', TG_OP;
END;
$$;

CREATE TRIGGER credit_entries_append_only
    BEFORE UPDATE OR DELETE ON credit_entries
    FOR EACH ROW EXECUTE FUNCTION credit_entries_append_only();

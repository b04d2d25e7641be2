-- Who may call what: producer accounts and their API keys, the dashboard's
-- sessions and its sign-in throttle. (Which user a build belongs to is
-- builds.owner_id: the API sets it to the key's user.)

-- A producer account. Its id is the name the platform's records already
-- carry as user_id (tasks.user_id, resources.user_id, credit_entries.user_id).
CREATE TABLE users (
    id          TEXT PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9_:@-]{1,128}$'),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- An API key: only its SHA-256 is kept (the key itself is shown once, at
-- creation). key_id is public: it is in the key's text, in `conveyor keys
-- list`, and names the key to revoke.
CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    user_id     TEXT NOT NULL REFERENCES users (id),
    digest      TEXT NOT NULL CHECK (length(digest) = 64),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at  TIMESTAMPTZ
);

CREATE INDEX api_keys_by_user ON api_keys (user_id, created_at);

-- A signed-in dashboard browser. The cookie is a random value; only its
-- SHA-256 is kept, so a copy of this table signs nobody in. Logout revokes.
CREATE TABLE admin_sessions (
    digest      TEXT PRIMARY KEY CHECK (length(digest) = 64),
    client      TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at  TIMESTAMPTZ NOT NULL,
    revoked_at  TIMESTAMPTZ
);

CREATE INDEX admin_sessions_expiry ON admin_sessions (expires_at);

-- Failed dashboard sign-ins by client address, counted over a sliding minute.
CREATE TABLE admin_login_failures (
    client     TEXT NOT NULL,
    failed_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX admin_login_failures_by_client ON admin_login_failures (client, failed_at);

-- A dashboard session is bound to the admin token that opened it (a slow
-- derivation of it, never the token; see conveyor/api/sessions.py): rotating
-- CONVEYOR_ADMIN_TOKEN ends every session opened with the old one. Sessions
-- from before this migration have no epoch and end now.
ALTER TABLE admin_sessions ADD COLUMN token_epoch TEXT NOT NULL DEFAULT '';

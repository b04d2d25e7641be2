-- name: apply_entry
-- Insert-first: the entry goes in only if its reference is new, and the
-- balance moves only by an entry that went in. One statement is one
-- transaction; the account is created on its first entry. Returns no row
-- when the reference was already applied.
WITH entry AS (
    INSERT INTO credit_entries (reference_id, user_id, kind, amount, tokens, task_id, message_id)
    VALUES (%(reference_id)s, %(user_id)s, %(kind)s, %(amount)s, %(tokens)s, %(task_id)s, %(message_id)s)
    ON CONFLICT (reference_id) DO NOTHING
    RETURNING user_id, amount
)
INSERT INTO credit_accounts AS a (user_id, balance)
SELECT user_id, amount FROM entry
ON CONFLICT (user_id) DO UPDATE
    SET balance = a.balance + EXCLUDED.balance, updated_at = now()
RETURNING a.balance

-- name: balance
SELECT balance FROM credit_accounts WHERE user_id = %(user_id)s

-- name: entries
SELECT reference_id, kind, amount, tokens, task_id, message_id, created_at
FROM credit_entries WHERE user_id = %(user_id)s ORDER BY id

-- name: verify
-- Accounts whose balance is not the sum of their entries.
SELECT a.user_id, a.balance, coalesce(sum(e.amount), 0) AS entries_sum
FROM credit_accounts a LEFT JOIN credit_entries e ON e.user_id = a.user_id
GROUP BY a.user_id, a.balance
HAVING a.balance <> coalesce(sum(e.amount), 0)
ORDER BY a.user_id

-- name: totals
SELECT count(*) AS accounts, (SELECT count(*) FROM credit_entries) AS entries FROM credit_accounts

-- name: take
-- Admit all or none (conveyor_budget_take, migration 0066): the seconds each budget needs, all 0 when admitted.
SELECT conveyor_budget_take(%(keys)s, %(limits)s, %(pers)s, %(weights)s, false)

-- name: spend
SELECT conveyor_budget_take(%(keys)s, %(limits)s, %(pers)s, %(weights)s, true)

-- name: usage
-- The keys of one budget with weight in their window now (on the database's clock), the most used
-- first; `total` counts them all (the same on every row). Rows past their window that no admission
-- has deleted yet do not count.
SELECT key, sum(weight) AS used, count(*) OVER () AS total
FROM conveyor_budget_entries
WHERE (key = %(name)s OR starts_with(key, %(prefix)s)) AND at > clock_timestamp() - make_interval(secs => %(per)s)
GROUP BY key
ORDER BY used DESC, key
LIMIT %(limit)s

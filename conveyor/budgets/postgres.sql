-- name: take
-- Admit all or none (conveyor_budget_take, migration 0066): the seconds each budget needs, all 0 when admitted.
SELECT conveyor_budget_take(%(keys)s, %(limits)s, %(pers)s, %(weights)s, false)

-- name: spend
SELECT conveyor_budget_take(%(keys)s, %(limits)s, %(pers)s, %(weights)s, true)

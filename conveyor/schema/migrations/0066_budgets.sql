-- Budgets (conveyor/budgets/): weighted rate limits kept fleet-wide, as sliding-window logs.
-- One row per admitted or spent weight; a row counts while it is younger than its budget's
-- window, and the next admission of its key deletes it after that.
--
--   key     the budget's name and key value (``provider-tokens:<provider key>``)
--   at      when, on the server's clock (clock_timestamp() after the key's lock)
--   weight  what was taken

CREATE TABLE conveyor_budget_entries (
    id      BIGSERIAL PRIMARY KEY,
    key     TEXT NOT NULL CHECK (length(key) BETWEEN 1 AND 300),
    at      TIMESTAMPTZ NOT NULL,
    weight  DOUBLE PRECISION NOT NULL CHECK (weight > 0)
);
CREATE INDEX conveyor_budget_entries_key_at ON conveyor_budget_entries (key, at);
-- Keys no job asks for again (a user gone quiet) are pruned by age, a batch per admission; no
-- budget's window is longer than a day (conveyor/budgets/base.py MAX_PER).
CREATE INDEX conveyor_budget_entries_at ON conveyor_budget_entries (at);

-- Admit all of the given budgets or none, in one statement: returns the seconds each budget needs
-- before it would admit, all 0 when the weights were recorded. ``force``: record without checking
-- (a job reporting what it used). The rule (conveyor/budgets/base.py ``admits``): the window's sum is
-- below the limit and stays within it after the weight, unless the window is empty.
CREATE FUNCTION conveyor_budget_take(
    keys TEXT[], limits DOUBLE PRECISION[], pers DOUBLE PRECISION[], weights DOUBLE PRECISION[], force BOOLEAN
) RETURNS DOUBLE PRECISION[] LANGUAGE plpgsql AS $$
DECLARE
    n INTEGER := coalesce(array_length(keys, 1), 0);
    i INTEGER;
    t TIMESTAMPTZ;
    total DOUBLE PRECISION;
    wait DOUBLE PRECISION;
    waits DOUBLE PRECISION[] := '{}';
    refused BOOLEAN := false;
    e RECORD;
BEGIN
    -- In key order: two admissions over the same budgets never wait on each other's locks in a cycle.
    FOR i IN SELECT u.ord FROM unnest(keys) WITH ORDINALITY AS u(k, ord) ORDER BY u.k LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('conveyor:budget:' || keys[i], 0));
    END LOOP;
    t := clock_timestamp();  -- after the locks: each admission of a key sees every earlier one
    FOR i IN 1 .. n LOOP
        DELETE FROM conveyor_budget_entries b
        WHERE b.key = keys[i] AND b.at <= t - make_interval(secs => pers[i]);
        wait := 0;
        IF NOT force THEN
            SELECT coalesce(sum(b.weight), 0) INTO total FROM conveyor_budget_entries b WHERE b.key = keys[i];
            IF NOT (total < limits[i] AND (total <= 0 OR total + weights[i] <= limits[i])) THEN
                refused := true;
                wait := pers[i];
                FOR e IN SELECT b.at, b.weight FROM conveyor_budget_entries b WHERE b.key = keys[i] ORDER BY b.at, b.id LOOP
                    total := total - e.weight;
                    IF total < limits[i] AND (total <= 0 OR total + weights[i] <= limits[i]) THEN
                        wait := greatest(extract(epoch FROM e.at - t) + pers[i], 0.001);
                        EXIT;
                    END IF;
                END LOOP;
            END IF;
        END IF;
        waits := waits || wait;
    END LOOP;
    DELETE FROM conveyor_budget_entries b WHERE b.id IN (
        SELECT o.id FROM conveyor_budget_entries o WHERE o.at < t - interval '1 day' LIMIT 100
    );
    IF NOT refused THEN
        INSERT INTO conveyor_budget_entries (key, at, weight)
        SELECT keys[g.idx], t, weights[g.idx] FROM generate_series(1, n) AS g(idx) WHERE weights[g.idx] > 0;
    END IF;
    RETURN waits;
END
$$;

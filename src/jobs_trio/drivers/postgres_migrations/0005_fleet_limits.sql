-- Fleet limits (issue 15): each job's limits as its enqueue resolved them (NULL keys: none, the
-- claim's fast path), what a job a claim put off waits for, and the limit rows themselves: a
-- key's N rows, free once `until` is unset or past (drivers/limit_rules.py).

ALTER TABLE {schema}.jobs
    ADD COLUMN slot_key text,
    ADD COLUMN slots integer,
    ADD COLUMN rate_key text,
    ADD COLUMN starts integer,
    ADD COLUMN per double precision,
    -- 'slot:KEY' or 'rate:KEY' while a claim has put the job off for that limit; NULL once
    -- claimed.
    ADD COLUMN waiting_on text;

-- A settle that frees a slot makes the first job waiting on it due; stats count the waiting.
CREATE INDEX jobs_waiting_on ON {schema}.jobs (waiting_on, priority, run_at, id)
    WHERE waiting_on IS NOT NULL;

CREATE TABLE {schema}.limit_rows (
    kind text NOT NULL CHECK (kind IN ('slot', 'rate')),
    key text COLLATE "C" NOT NULL,
    n integer NOT NULL,
    -- A slot row: its run's lease (renewed with it, cleared by its settle). A rate row: when
    -- the start it records is a window old.
    until double precision,
    token text,  -- the run holding a slot row; renew and settle find it by this
    job_id text,
    PRIMARY KEY (kind, key, n)
);

CREATE INDEX limit_rows_token ON {schema}.limit_rows (token) WHERE token IS NOT NULL;

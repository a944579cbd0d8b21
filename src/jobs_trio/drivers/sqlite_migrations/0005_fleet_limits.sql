-- Fleet limits (issue 15): each job's limits as its enqueue resolved them (NULL keys: none, the
-- claim's fast path), what a job a claim put off waits for, and the limit rows themselves: a
-- key's N rows, free once `until` is unset or past (drivers/limit_rules.py).

ALTER TABLE jobs ADD COLUMN slot_key TEXT;
ALTER TABLE jobs ADD COLUMN slots INTEGER;
ALTER TABLE jobs ADD COLUMN rate_key TEXT;
ALTER TABLE jobs ADD COLUMN starts INTEGER;
ALTER TABLE jobs ADD COLUMN per REAL;
-- 'slot:KEY' or 'rate:KEY' while a claim has put the job off for that limit; NULL once claimed.
ALTER TABLE jobs ADD COLUMN waiting_on TEXT;

-- A settle that frees a slot makes the first job waiting on it due; stats count the waiting.
CREATE INDEX IF NOT EXISTS jobs_waiting_on ON jobs (waiting_on, priority, run_at, id)
    WHERE waiting_on IS NOT NULL;

CREATE TABLE IF NOT EXISTS limit_rows (
    kind   TEXT NOT NULL CHECK (kind IN ('slot', 'rate')),
    key    TEXT NOT NULL,
    n      INTEGER NOT NULL,
    -- A slot row: its run's lease (renewed with it, cleared by its settle). A rate row: when
    -- the start it records is a window old.
    until  REAL,
    token  TEXT,  -- the run holding a slot row; renew and settle find it by this
    job_id TEXT,
    PRIMARY KEY (kind, key, n)
);

CREATE INDEX IF NOT EXISTS limit_rows_token ON limit_rows (token) WHERE token IS NOT NULL;

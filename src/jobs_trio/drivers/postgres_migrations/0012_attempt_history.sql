-- Each job's attempt history (issue 36): a ring of the newest rules.ATTEMPT_HISTORY endings, the
-- ending numbered `seq` in slot `seq % ATTEMPT_HISTORY`, written by the settle statement that
-- ends the attempt (an upsert: the ring never grows), deleted with its job. `attempt_seq` counts
-- a job's endings; a constant default, so adding it rewrites no row.

ALTER TABLE {schema}.jobs ADD COLUMN attempt_seq integer NOT NULL DEFAULT 0;

CREATE TABLE {schema}.attempts (
    job_id text COLLATE "C" NOT NULL REFERENCES {schema}.jobs (id) ON DELETE CASCADE,
    slot integer NOT NULL,
    seq integer NOT NULL,
    attempt integer NOT NULL,
    outcome text NOT NULL,
    worker_id text,
    seconds double precision,
    ended_at double precision NOT NULL,
    error text,
    traceback text,
    PRIMARY KEY (job_id, slot)
);

-- The dashboard's charts: attempts by the time they ended, read for the last hour only.
CREATE INDEX attempts_ended ON {schema}.attempts (ended_at);

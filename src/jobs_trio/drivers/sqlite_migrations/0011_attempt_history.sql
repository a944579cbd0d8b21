-- Each job's attempt history (issue 36): a ring of the newest rules.ATTEMPT_HISTORY endings, the
-- ending numbered `seq` in slot `seq % ATTEMPT_HISTORY`, written by the settle that ends the
-- attempt (an upsert: the ring never grows), deleted with its job. `attempt_seq` counts a job's
-- endings; constant default, so adding it rewrites no row.

ALTER TABLE jobs ADD COLUMN attempt_seq INTEGER NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS attempts (
    job_id    TEXT NOT NULL,
    slot      INTEGER NOT NULL,
    seq       INTEGER NOT NULL,
    attempt   INTEGER NOT NULL,
    outcome   TEXT NOT NULL,
    worker_id TEXT,
    seconds   REAL,
    ended_at  REAL NOT NULL,
    error     TEXT,
    traceback TEXT,
    PRIMARY KEY (job_id, slot)
);

-- The dashboard's charts: attempts by the time they ended, read for the last hour only.
CREATE INDEX IF NOT EXISTS attempts_ended ON attempts (ended_at);

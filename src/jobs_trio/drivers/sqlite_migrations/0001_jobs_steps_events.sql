-- The first SQLite schema: jobs, their step records, and events. Applied by the SQLite driver
-- on open, inside one BEGIN IMMEDIATE transaction that also stores user_version = 1.

CREATE TABLE IF NOT EXISTS jobs (
    id               TEXT PRIMARY KEY,
    name             TEXT NOT NULL,
    queue            TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN
                         ('ready', 'running', 'completed', 'dead', 'suspended', 'parked', 'cancelled')),
    payload          TEXT NOT NULL,
    priority         INTEGER NOT NULL,
    attempts         INTEGER NOT NULL,
    max_attempts     INTEGER NOT NULL,
    run_at           REAL NOT NULL,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    key              TEXT,
    last_error       TEXT,
    result           TEXT,
    lease_until      REAL,
    worker_id        TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    wait_event       TEXT,
    -- The current claim's fencing token; NULL unless running. Never read into a JobRecord.
    token            TEXT
);

-- A unique key is held while its job can still run (the live states); a finished job frees it.
-- The enqueue's ON CONFLICT target repeats this WHERE clause word for word: keep them equal.
CREATE UNIQUE INDEX IF NOT EXISTS jobs_live_key ON jobs (key)
    WHERE key IS NOT NULL AND state IN ('ready', 'running', 'suspended', 'parked');

-- The claim: one queue and state at a time, in claim order, so LIMIT stops early.
CREATE INDEX IF NOT EXISTS jobs_claim ON jobs (queue, state, priority, run_at, id);

-- wait_for_work's "when is the next one due", and stats' due count, without a scan.
CREATE INDEX IF NOT EXISTS jobs_next_due ON jobs (queue, state, run_at);

-- list_jobs: newest first.
CREATE INDEX IF NOT EXISTS jobs_newest ON jobs (created_at, id);

-- send_event: the jobs suspended on an event name.
CREATE INDEX IF NOT EXISTS jobs_waiting ON jobs (wait_event) WHERE state = 'suspended';

CREATE TABLE IF NOT EXISTS steps (
    job_id      TEXT NOT NULL,
    name        TEXT NOT NULL,
    status      TEXT NOT NULL,
    started_at  REAL NOT NULL,
    finished_at REAL,
    result      TEXT,
    wake_at     REAL,
    event       TEXT,
    match       TEXT,
    PRIMARY KEY (job_id, name)
);

-- AUTOINCREMENT: an event id is never handed out twice, so find_event's "earliest" (lowest id)
-- stays the order events were sent in.
CREATE TABLE IF NOT EXISTS events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT NOT NULL,
    key        TEXT,
    payload    TEXT NOT NULL,
    created_at REAL NOT NULL
);

CREATE INDEX IF NOT EXISTS events_by_name ON events (name, id);
CREATE INDEX IF NOT EXISTS events_by_name_and_key ON events (name, key, id);

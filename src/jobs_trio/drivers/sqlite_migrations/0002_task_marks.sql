-- Cron tasks: each task's mark (every scheduled time up to handled_until is done, fired or
-- skipped) and a record of its recent fires, one row per (task, scheduled time): the unique key
-- a second fire of the same time would break, written in the transaction that enqueues it.

CREATE TABLE IF NOT EXISTS task_marks (
    task          TEXT PRIMARY KEY,
    handled_until REAL NOT NULL,
    last_fired    REAL,
    last_fired_at REAL,
    last_job_id   TEXT,
    updated_at    REAL NOT NULL
);

CREATE TABLE IF NOT EXISTS task_fires (
    task      TEXT NOT NULL,
    scheduled REAL NOT NULL,
    job_id    TEXT NOT NULL,
    fired_at  REAL NOT NULL,
    PRIMARY KEY (task, scheduled)
);

-- Cron tasks: each task's mark (every scheduled time up to handled_until is done, fired or
-- skipped) and a record of its recent fires, one row per (task, scheduled time): the unique key
-- a second fire of the same time would break, written in the transaction that enqueues it.

CREATE TABLE {schema}.task_marks (
    task text COLLATE "C" PRIMARY KEY,
    handled_until double precision NOT NULL,
    last_fired double precision,
    last_fired_at double precision,
    last_job_id text,
    updated_at double precision NOT NULL
);

CREATE TABLE {schema}.task_fires (
    task text COLLATE "C" NOT NULL,
    scheduled double precision NOT NULL,
    job_id text NOT NULL,
    fired_at double precision NOT NULL,
    PRIMARY KEY (task, scheduled)
);

-- The fleet's workers as they announce themselves every stats interval (issue 36): what the
-- dashboard lists as live. A stopped worker deletes its row; a crashed one's is deleted by the
-- next announcement an hour after its last (rules.FORGET_WORKERS_AFTER).

CREATE TABLE IF NOT EXISTS workers (
    worker_id   TEXT PRIMARY KEY,
    host        TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    queues      TEXT NOT NULL,  -- a JSON array
    concurrency INTEGER NOT NULL,
    running     INTEGER NOT NULL,
    state       TEXT NOT NULL,
    version     TEXT NOT NULL,
    started_at  REAL NOT NULL,
    seen_at     REAL NOT NULL,
    every       REAL NOT NULL
);

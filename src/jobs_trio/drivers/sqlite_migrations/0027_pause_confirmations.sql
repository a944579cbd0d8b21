-- Pauses a worker confirms it heard (issue 46): every pause and resume counts one more epoch
-- (pause_epoch, one row), a pause keeps the epoch that made it, and each worker records the
-- latest epoch it acts on (pauses_heard). `jobs_trio.pause_queue` returns once every worker
-- holding jobs of the queue has confirmed its pause's epoch: from then nothing of it starts.
-- Additive: a release before it never reads these, and its pauses leave `epoch` NULL.

ALTER TABLE queue_pauses ADD COLUMN epoch INTEGER;

CREATE TABLE IF NOT EXISTS pause_epoch (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL
);
INSERT OR IGNORE INTO pause_epoch (id, epoch) VALUES (1, 0);

CREATE TABLE IF NOT EXISTS pauses_heard (
    worker_id TEXT PRIMARY KEY,
    epoch     INTEGER NOT NULL,
    heard_at  REAL NOT NULL
);

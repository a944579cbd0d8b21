-- Pauses a worker confirms it heard (issue 46): every pause and resume counts one more epoch
-- (pause_epoch, one row, updated by each change in its transaction, so the epochs follow the
-- order the changes commit in), a pause keeps the epoch that made it, and each worker records
-- the latest epoch it acts on (pauses_heard). `jobs_trio.pause_queue` returns once every worker
-- holding jobs of the queue has confirmed its pause's epoch: from then nothing of it starts.
-- Additive: a release before it never reads these, and its pauses leave `epoch` NULL.

ALTER TABLE {schema}.queue_pauses ADD COLUMN epoch bigint;

CREATE TABLE {schema}.pause_epoch (
    id int PRIMARY KEY CHECK (id = 1),
    epoch bigint NOT NULL
);
INSERT INTO {schema}.pause_epoch (id, epoch) VALUES (1, 0);

CREATE TABLE {schema}.pauses_heard (
    worker_id text PRIMARY KEY,  -- as jobs.worker_id, which pause_holders joins it to
    epoch bigint NOT NULL,
    heard_at double precision NOT NULL
);

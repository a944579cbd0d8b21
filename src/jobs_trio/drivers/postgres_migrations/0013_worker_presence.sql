-- The fleet's workers as they announce themselves every stats interval (issue 36): what the
-- dashboard lists as live. A stopped worker deletes its row; a crashed one's is deleted by the
-- next announcement an hour after its last (rules.FORGET_WORKERS_AFTER).

CREATE TABLE {schema}.workers (
    worker_id text COLLATE "C" PRIMARY KEY,
    host text NOT NULL,
    pid integer NOT NULL,
    queues text NOT NULL,  -- a JSON array, as text like every JSON value here
    concurrency integer NOT NULL,
    running integer NOT NULL,
    state text NOT NULL,
    version text NOT NULL,
    started_at double precision NOT NULL,
    seen_at double precision NOT NULL,
    every double precision NOT NULL
);

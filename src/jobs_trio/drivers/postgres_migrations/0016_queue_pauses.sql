-- The paused queues (issue 46): a queue with a row here starts nothing anywhere, claims skip it,
-- until an operator resumes it (the row is deleted). Durable, so a pause outlives every worker
-- and a restart. A pause takes this table ACCESS EXCLUSIVE before it writes: it waits for the
-- claims that read the table before it (they end first, so their jobs were running at the
-- pause), and a claim that reads the table after it waits for the pause's commit and then takes
-- its snapshot, so it sees the pause (postgres_queries.sql, `pause_queue`).

CREATE TABLE {schema}.queue_pauses (
    queue text COLLATE "C" PRIMARY KEY,
    paused_at double precision NOT NULL,
    paused_by text
);

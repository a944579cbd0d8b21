-- The paused queues (issue 46): a queue with a row here starts nothing anywhere, claims skip it,
-- until an operator resumes it (the row is deleted). Durable, so a pause outlives every worker
-- and a restart; claims read it inside their own transaction (BEGIN IMMEDIATE), so a claim is
-- ordered before or after a pause, never beside it.

CREATE TABLE IF NOT EXISTS queue_pauses (
    queue     TEXT PRIMARY KEY,
    paused_at REAL NOT NULL,
    paused_by TEXT
);

-- The relay's exactly-once, independent of retention and of when a relay dies (issue 33).
--
-- outbox_source: who this file's outbox is. A random id made here once; a relay records it
-- with each decision in the job store, so that the decisions of one outbox are swept (once
-- their rows are gone from it) without touching those of another outbox sharing the store.
-- (A relay knows the job store is this same file by its path: no probe, as PostgreSQL has.)
--
-- outbox_decisions: in the JOB STORE, what became of each relayed outbox row (a job created,
-- or a no-op because a live job held its key, and which job that was), written in the same
-- transaction as the job. A row taken again (its relay died before deleting it) is answered
-- from here, whatever happened to the job since (finished, pruned) and whoever holds its key
-- now. Kept only while the row may still be taken: deleted once the row is gone.
--
-- The outbox's fleet limits: a relayed job is limited as its declaration says, resolved from
-- its payload when the application wrote it (fleet_limits.py), as a direct enqueue is.

CREATE TABLE IF NOT EXISTS outbox_source (
    one_row INTEGER PRIMARY KEY CHECK (one_row = 1),
    id      TEXT NOT NULL
);
INSERT INTO outbox_source (one_row, id) VALUES (1, lower(hex(randomblob(16))));

CREATE TABLE IF NOT EXISTS outbox_decisions (
    id         TEXT PRIMARY KEY,
    source     TEXT NOT NULL,
    outcome    TEXT NOT NULL CHECK (outcome IN ('created', 'key-held')),
    holder     TEXT NOT NULL,
    decided_at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS outbox_decisions_by_source ON outbox_decisions (source, decided_at);

ALTER TABLE outbox ADD COLUMN slot_key TEXT;
ALTER TABLE outbox ADD COLUMN slots INTEGER;
ALTER TABLE outbox ADD COLUMN rate_key TEXT;
ALTER TABLE outbox ADD COLUMN starts INTEGER;
ALTER TABLE outbox ADD COLUMN per REAL;

-- The relay's exactly-once, independent of retention and of when a relay dies (issue 33).
--
-- outbox_source: who this database's outbox is. A random id made here once; a relay records
-- it with each decision in the job store, so that the decisions of one outbox are swept (once
-- their rows are gone from it) without touching those of another outbox sharing the store.
-- `probe`: what a relay writes through the outbox's driver and reads back through the job
-- store's, to learn that both are one database (then a row's job and its removal commit
-- together, and nothing needs recording).
--
-- outbox_decisions: in the JOB STORE, what became of each relayed outbox row (a job created,
-- or a no-op because a live job held its key, and which job that was), written in the same
-- transaction as the job. A row taken again (its relay died before deleting it) is answered
-- from here, whatever happened to the job since (finished, pruned) and whoever holds its key
-- now. Kept only while the row may still be taken: deleted once the row is gone.
--
-- The outbox's fleet limits: a relayed job is limited as its declaration says, resolved from
-- its payload when the application wrote it (fleet_limits.py), as a direct enqueue is.

CREATE TABLE {schema}.outbox_source (
    one_row boolean PRIMARY KEY DEFAULT true CHECK (one_row),
    id text NOT NULL,
    probe text
);
INSERT INTO {schema}.outbox_source (id) VALUES (gen_random_uuid()::text);

CREATE TABLE {schema}.outbox_decisions (
    id text COLLATE "C" PRIMARY KEY,
    source text NOT NULL,
    outcome text NOT NULL CHECK (outcome IN ('created', 'key-held')),
    holder text NOT NULL,
    decided_at double precision NOT NULL
);
CREATE INDEX outbox_decisions_by_source ON {schema}.outbox_decisions (source, decided_at);

ALTER TABLE {schema}.outbox
    ADD COLUMN slot_key text,
    ADD COLUMN slots integer,
    ADD COLUMN rate_key text,
    ADD COLUMN starts integer,
    ADD COLUMN per double precision;

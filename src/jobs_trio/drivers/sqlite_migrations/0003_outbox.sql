-- The outbox: jobs an application wrote in its own transaction, in this file, waiting for a
-- relay to move them into the job store (which may be another database). A row is deleted
-- once its job is stored there; the job keeps the row's id, so a relay that died between the
-- two writes (or two relays taking one row) stores it once.

CREATE TABLE IF NOT EXISTS outbox (
    -- Relay order: the order rows were written in.
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    id            TEXT NOT NULL UNIQUE,
    name          TEXT NOT NULL,
    queue         TEXT NOT NULL,
    payload       TEXT NOT NULL,
    priority      INTEGER NOT NULL,
    max_attempts  INTEGER NOT NULL,
    key           TEXT,
    -- When the job is due, on this database's clock: its delay survives the wait in here.
    run_at        REAL NOT NULL,
    created_at    REAL NOT NULL,
    -- A relay's hold on the row; past it (the relay died) another relay takes it again.
    claimed_until REAL,
    relay_id      TEXT
);

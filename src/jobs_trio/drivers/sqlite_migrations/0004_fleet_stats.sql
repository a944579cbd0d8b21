-- The fleet's queue stats (issue 20): one row whose compare-and-set on taken_at gives one
-- worker per interval the full stats read; the others read what it stored in observed.

CREATE TABLE IF NOT EXISTS fleet_stats (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    taken_at  REAL,
    worker_id TEXT,
    observed  TEXT
);

INSERT OR IGNORE INTO fleet_stats (id) VALUES (1);

-- Retention (issue 16): the finished jobs by the time of their last change, one partial index
-- per state (SQLite uses a partial index only when the query repeats its WHERE term: a prune
-- asks for one state at a time), and the fleet's one prune turn (retention.py).

CREATE INDEX IF NOT EXISTS jobs_completed_at ON jobs (updated_at) WHERE state = 'completed';
CREATE INDEX IF NOT EXISTS jobs_cancelled_at ON jobs (updated_at) WHERE state = 'cancelled';
CREATE INDEX IF NOT EXISTS jobs_dead_at ON jobs (updated_at) WHERE state = 'dead';

CREATE TABLE IF NOT EXISTS prune_turn (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    holder     TEXT,
    held_until REAL,
    ended_at   REAL
);

INSERT OR IGNORE INTO prune_turn (id) VALUES (1);

-- Retention (issue 16): the finished jobs by the time of their last change, so a prune batch
-- reads the oldest finished rows through an index holding only finished rows (a table of live
-- work pays nothing for it), and the fleet's one prune turn (retention.py).

CREATE INDEX jobs_finished ON {schema}.jobs (state, updated_at)
    WHERE state IN ('completed', 'cancelled', 'dead');

CREATE TABLE {schema}.prune_turn (
    id integer PRIMARY KEY CHECK (id = 1),
    holder text,
    held_until double precision,
    ended_at double precision
);

INSERT INTO {schema}.prune_turn (id) VALUES (1);

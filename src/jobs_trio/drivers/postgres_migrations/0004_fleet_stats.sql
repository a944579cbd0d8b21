-- The fleet's queue stats (issue 20): one row whose compare-and-set on taken_at gives one
-- worker per interval the full stats read; the others read what it stored in observed.

CREATE TABLE {schema}.fleet_stats (
    id integer PRIMARY KEY CHECK (id = 1),
    taken_at double precision,
    worker_id text,
    observed text
);

INSERT INTO {schema}.fleet_stats (id) VALUES (1);

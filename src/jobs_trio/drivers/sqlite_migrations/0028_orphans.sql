-- A worker's death charges nobody it cannot blame (issue 45): `orphans` counts the times a claim
-- found the job's lease lapsed and handed it back uncounted (rules.orphaning); `alone` marks a
-- running suspect claimed with nothing beside it, whose lapse is then its own doing. The index
-- finds the due suspects for a worker that runs nothing (claim(alone=True)) without reading the
-- queue; its WHERE is rules.SUSPECT_AT's, and the claim's query repeats it to the letter.
-- Additive: constant defaults, and a release before it reads neither column.

ALTER TABLE jobs ADD COLUMN orphans INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN alone INTEGER NOT NULL DEFAULT 0;

CREATE INDEX IF NOT EXISTS jobs_suspects ON jobs (queue, state, priority, run_at, id)
    WHERE orphans >= 2;

-- A worker's death charges nobody it cannot blame (issue 45): `orphans` counts the times a claim
-- found the job's lease lapsed and handed it back uncounted (rules.orphaning); `alone` marks a
-- running suspect claimed with nothing beside it, whose lapse is then its own doing. The index
-- that finds the suspects is 0029's (built CONCURRENTLY on a large table).
-- Additive: constant defaults, so adding them rewrites no row; a release before it reads neither.

ALTER TABLE {schema}.jobs
    ADD COLUMN orphans int NOT NULL DEFAULT 0,
    ADD COLUMN alone boolean NOT NULL DEFAULT false;

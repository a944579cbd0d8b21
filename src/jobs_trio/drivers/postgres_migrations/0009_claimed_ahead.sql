-- Claims taken ahead of a free slot (issue 16): `ahead` marks a running job claimed ahead whose
-- start no renewal has recorded yet, so a lapse of its lease gives its attempt back; and
-- `ahead_lapses` counts those give-backs, to bound them (rules.hands_back_lapse). Constant
-- defaults: adding them rewrites no row.

ALTER TABLE {schema}.jobs
    ADD COLUMN ahead boolean NOT NULL DEFAULT false,
    ADD COLUMN ahead_lapses int NOT NULL DEFAULT 0;

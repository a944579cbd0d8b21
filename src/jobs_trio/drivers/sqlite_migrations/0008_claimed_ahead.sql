-- Claims taken ahead of a free slot (issue 16): `ahead` marks a running job claimed ahead whose
-- start no renewal has recorded yet, so a lapse of its lease gives its attempt back; and
-- `ahead_lapses` counts those give-backs, to bound them (rules.hands_back_lapse).

ALTER TABLE jobs ADD COLUMN ahead INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN ahead_lapses INTEGER NOT NULL DEFAULT 0;

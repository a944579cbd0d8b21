-- The newest-first listing's index keeps the id as a payload, not a key column (issue 16). As a
-- key column it let a plan made on an empty table's statistics (a fresh deploy: every cost is
-- zero, so every index ties) find rows BY ID through this index, walking it whole: the claim's
-- UPDATE, each settle and renew grew with every job ever stored (14 ms a claim at 20,000).
-- Only the primary key can answer an id now. A listing's tie on created_at is sorted by id in
-- each group of equal times (an incremental sort over the index order).
DROP INDEX {schema}.jobs_created;
CREATE INDEX jobs_created ON {schema}.jobs (created_at DESC) INCLUDE (id);

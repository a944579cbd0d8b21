-- transaction: none
-- The due suspects (rules.SUSPECT_AT: orphaned twice) in claim order, for a worker that runs
-- nothing (claim(alone=True)): without it that claim read every waiting job of its queues. The
-- WHERE is the claim's own, to the letter. Partial: it holds only suspects, a handful.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_suspects ON {schema}.jobs (queue, priority, run_at, id)
    WHERE orphans >= 2 AND state IN ('ready', 'suspended');

-- Unique keys with a window (issue 47): an enqueue with unique_for looks for a job of its key
-- created within the window, in any state; this index finds the newest such job without
-- reading the key's whole history (a key reused daily for years).
--
-- Built CONCURRENTLY, outside a transaction (issue 49): a plain build blocks every write to jobs
-- while it scans the table (bench/migration_index.py, 2,000,000 jobs: 3.3 s, an enqueue failed at
-- the pool's lock timeout). A small table's is built in a transaction (_postgres_index_builds).
-- transaction: none
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_key_created ON {schema}.jobs (key, created_at)
    WHERE key IS NOT NULL;

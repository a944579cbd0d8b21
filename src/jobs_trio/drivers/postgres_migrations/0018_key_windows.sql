-- Unique keys with a window (issue 47): an enqueue with unique_for looks for a job of its key
-- created within the window, in any state; this index finds the newest such job without
-- reading the key's whole history (a key reused daily for years).
CREATE INDEX jobs_key_created ON {schema}.jobs (key, created_at) WHERE key IS NOT NULL;

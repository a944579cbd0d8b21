-- The attempt history no longer references its job by a foreign key (issue 44): the key's check
-- ran a query and took a KEY SHARE lock on the job's row for every attempt recorded, ~10% of the
-- server's CPU a job for a worker of no-op jobs (bench/server_cpu.py). Its one use, deleting a
-- job's history with the job, is now the deletes' own (delete_job, prune_history), as SQLite's
-- driver always did it. Additive: a previous release writes the history as before; a job it
-- deletes against this schema (an operator's delete, a prune batch while a deploy rolls) leaves
-- its records behind, read by no one (the history is read by its job's id, a fresh random one).
ALTER TABLE {schema}.attempts DROP CONSTRAINT IF EXISTS attempts_job_id_fkey;

-- The attempt history no longer references its job by a foreign key (issue 44): the key's check
-- ran a query and took a KEY SHARE lock on the job's row for every attempt recorded, ~10% of the
-- server's CPU a job for a worker of no-op jobs (bench/server_cpu.py). Its one use, deleting a
-- job's history with the job, is now the deletes' own (delete_job, prune_history), as SQLite's
-- driver always did it. Additive: a previous release writes the history as before; a job it
-- deletes against this schema (an operator's delete, a prune batch while a deploy rolls) leaves
-- its records behind: never read by job (ids are not reused), counted only in the dashboard's
-- last hour of endings. Every such key goes, whatever its name (0012 named it by default; one
-- made again by hand may not be). Dropping it takes the jobs table's lock too, for a moment,
-- as adding a column does (the migration waits 0.5 s for it at most, and tries again).
DO $$
DECLARE
    fk name;
BEGIN
    FOR fk IN
        SELECT conname FROM pg_constraint
        WHERE conrelid = '{schema}.attempts'::regclass AND contype = 'f'
          AND confrelid = '{schema}.jobs'::regclass
    LOOP
        EXECUTE format('ALTER TABLE {schema}.attempts DROP CONSTRAINT %I', fk);
    END LOOP;
END $$;

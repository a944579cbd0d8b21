-- The relay's writes fenced by the batch they hold (issue 45): a relay paused past its lease
-- (SIGSTOP, a VM freeze) wrote its batch again once another relay had moved it and retention
-- had pruned the jobs.
--
-- relay_tickets: in the JOB STORE, the live ticket of each relay's next or current batch,
-- recorded before the relay takes any row under it. The write of a batch (relay_enqueue) spends
-- its ticket in the same transaction as the jobs; a relay that takes a row over revokes the
-- tickets of the relays that held it before in ITS write's transaction, so a write under a
-- revoked ticket finds none and is refused (X_RELAY_FENCED). Forgotten once stale (rules.
-- ticket_stale_at): a relay that died idle leaves one row, for a while.
--
-- outbox.ticket: the ticket of the relay holding the row; outbox.superseded the tickets of every
-- relay that held it before, all of them revoked by the next write.

ALTER TABLE {schema}.outbox
    ADD COLUMN ticket text,
    ADD COLUMN superseded text[];

CREATE TABLE {schema}.relay_tickets (
    ticket text COLLATE "C" PRIMARY KEY,
    source text NOT NULL,
    relay_id text NOT NULL,
    stale_at double precision NOT NULL
);
CREATE INDEX relay_tickets_by_age ON {schema}.relay_tickets (stale_at);

-- No lost wake-up between a job's suspend and a send of its event (issue 45): on PostgreSQL a
-- send 0-5 ms after a job's look for its event was missed by 9-27% of 3,000 waiting jobs (they
-- slept their event_poll), and a send in an application's transaction that committed after the
-- job suspended was missed always. Three pieces, each needed (rules.woken):
--
-- events.xid: the transaction that stored the event. A look's mark is its snapshot; an event
-- whose transaction that snapshot could not see was sent after the look. (An id cannot say
-- so: ids are given at insert, and a transaction holding a lower one may commit later.) NULL
-- for the events stored before this migration, all older than any look to come.
ALTER TABLE {schema}.events ADD COLUMN xid xid8;
-- Set after the column was added: only new rows get it, and the table is not rewritten. Its
-- index is 0021's, built CONCURRENTLY: built here it held the events table's exclusive lock (the
-- ALTER's) through a scan of every event ever sent, and each send and look waited.
ALTER TABLE {schema}.events ALTER COLUMN xid SET DEFAULT pg_current_xact_id();

-- The lock of an event's name and key (NULL: the name's waiters of any key), in the server's
-- advisory lock space: salted with the schema, so two schemas on one server do not share one.
CREATE FUNCTION {schema}.event_lock_key(name text, key text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended(
        '{schema}' || chr(1) || name || chr(1) || coalesce(key, ''),
        CASE WHEN key IS NULL THEN 1 ELSE 2 END
    )
$$;

-- events_wake: a send wakes its waiters when it COMMITS (deferred to commit), whether it was
-- sent alone or in an application's transaction that commits later, under SHARED locks of its
-- name (every waiter of any key) and of its name and key: sends never wait on each other.
CREATE FUNCTION {schema}.events_wake() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    notified bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared({schema}.event_lock_key(NEW.name, NULL));
    IF NEW.key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock_shared({schema}.event_lock_key(NEW.name, NEW.key));
    END IF;
    -- A statement of its own after the locks: its snapshot sees a suspend that committed while
    -- this send waited for them. A job waiting for another key sleeps on (rules.send_wakes).
    WITH woken AS (
        UPDATE {schema}.jobs SET state = 'ready', run_at = NEW.created_at, updated_at = NEW.created_at
        WHERE state = 'suspended' AND wait_event = NEW.name
          AND (wait_key IS NULL OR wait_key = NEW.key)
        RETURNING queue
    )
    SELECT count(pg_notify(TG_TABLE_SCHEMA, q.queue)) INTO notified
    FROM (SELECT DISTINCT queue FROM woken) AS q;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER events_wake AFTER INSERT ON {schema}.events
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {schema}.events_wake();

-- suspend_sees_event: the settle's side, called for each suspension it writes. An EXCLUSIVE
-- try-lock of the name and key the wait matches, held to the settle's commit: a send that
-- commits after it waits for the settle, then finds the job suspended; one that committed
-- before is read here, by a statement that starts after the lock (a fresh snapshot: this
-- function is VOLATILE). A send committing at this very moment holds the lock: the job is made
-- ready rather than wait (a settle never waits on a send, so the two never deadlock).
CREATE FUNCTION {schema}.suspend_sees_event(event text, match text, seen text)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF event IS NULL OR seen IS NULL THEN
        RETURN false;
    END IF;
    IF NOT pg_try_advisory_xact_lock({schema}.event_lock_key(event, match)) THEN
        RETURN true;
    END IF;
    RETURN EXISTS (
        SELECT FROM {schema}.events AS e
        WHERE e.name = event AND (match IS NULL OR e.key = match)
          AND e.xid >= pg_snapshot_xmin(seen::pg_snapshot)
          AND NOT pg_visible_in_snapshot(e.xid, seen::pg_snapshot)
    );
END $$;

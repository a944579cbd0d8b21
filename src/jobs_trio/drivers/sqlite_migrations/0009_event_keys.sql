-- The event key a suspended job waits for (wait_for_event's match; NULL: any key). A send wakes
-- only the waiters of its name that wait for its key or for any: before, each send of a name
-- woke every job waiting on it, a fleet of workflows keyed by order id for each order's event.

ALTER TABLE jobs ADD COLUMN wait_key TEXT;
DROP INDEX IF EXISTS jobs_waiting;
CREATE INDEX IF NOT EXISTS jobs_waiting ON jobs (wait_event, wait_key) WHERE state = 'suspended';

-- The event key a suspended job waits for (wait_for_event's match; NULL: any key). A send wakes
-- only the waiters of its name that wait for its key or for any: before, each send of a name
-- woke every job waiting on it, a fleet of workflows keyed by order id for each order's event.
-- The partial index over suspended jobs leads with the name, then the key, for that look.

ALTER TABLE {schema}.jobs ADD COLUMN wait_key text;
CREATE INDEX jobs_suspended_on_key ON {schema}.jobs (wait_event, wait_key)
    WHERE state = 'suspended';
DROP INDEX {schema}.jobs_suspended_on;

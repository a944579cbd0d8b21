-- 0014's index of events by name and storing transaction (the settle's look for an event its
-- suspension's snapshot could not see), built CONCURRENTLY outside a transaction: the events
-- table keeps every event sent, and a send waits for no build (issue 49). A schema that applied
-- 0014 before it moved here has the index already, which this skips.
-- transaction: none
CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_name_xid ON {schema}.events (name, xid);

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
-- outbox.ticket: the ticket of the relay holding the row; outbox.superseded (a JSON array)
-- the tickets of every relay that held it before, all of them revoked by the next write.

ALTER TABLE outbox ADD COLUMN ticket TEXT;
ALTER TABLE outbox ADD COLUMN superseded TEXT;

CREATE TABLE IF NOT EXISTS relay_tickets (
    ticket   TEXT PRIMARY KEY,
    source   TEXT NOT NULL,
    relay_id TEXT NOT NULL,
    stale_at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS relay_tickets_by_age ON relay_tickets (stale_at);

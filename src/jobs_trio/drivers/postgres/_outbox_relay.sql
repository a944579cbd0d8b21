-- The outbox and relay capability's statements (_outbox_relay.py).
-- Placeholders and the loading: _postgres_sql.py.

-- name: enqueue_once_conflict
-- (A piece of `enqueue`, in _jobs.sql, which makes it `enqueue_once`.) The relay's enqueue:
-- like `enqueue`, but a job whose id is already stored (relayed before, by a relay that died
-- before deleting its outbox row, or by another relay) is a no-op too. No conflict target: the
-- primary key and the live-key index both turn a row into a no-op.
ON CONFLICT DO NOTHING;

-- name: stored_ids
SELECT id FROM {schema}.jobs WHERE id = ANY($1::text[]);

-- name: outbox_write
-- In the application's transaction (a savepoint in it): the rows exist once it commits. The
-- fleet limits ($11 to $15) as enqueue's: NULL for a job without them.
INSERT INTO {schema}.outbox (
    id, name, queue, payload, priority, max_attempts, key, run_at, created_at, context,
    slot_key, slots, rate_key, starts, per
)
SELECT n.id, n.name, n.queue, n.payload, n.priority, n.max_attempts, n.key,
       $1 + greatest(n.delay, 0), $1, n.context, n.slot_key, n.slots, n.rate_key, n.starts, n.per
FROM unnest(
    $2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::int[], $8::float8[],
    $9::text[], $10::text[], $11::text[], $12::int[], $13::text[], $14::int[], $15::float8[]
) WITH ORDINALITY AS n(
    id, name, queue, payload, priority, max_attempts, delay, key, context,
    slot_key, slots, rate_key, starts, per, ord
)
ORDER BY n.ord;

-- name: outbox_claim
-- Oldest first, skipping rows another relay is taking right now (SKIP LOCKED) or holds under a
-- live lease; a lapsed hold (its relay died or is paused) is taken again. $1 now, $2 lease,
-- $3 limit, $4 relay id, $5 its ticket. A row's past holders are kept in `superseded` (SET
-- reads the row as it was): the write of this batch revokes every one of them.
WITH taken AS (
    SELECT seq FROM {schema}.outbox
    WHERE claimed_until IS NULL OR claimed_until <= $1
    ORDER BY seq
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.outbox AS o
SET claimed_until = $1::float8 + $2::float8, relay_id = $4, ticket = $5,
    superseded = CASE WHEN o.ticket IS NULL THEN o.superseded
                      ELSE array_append(o.superseded, o.ticket) END
FROM taken
WHERE o.seq = taken.seq
RETURNING o.seq, o.id, o.name, o.queue, o.payload, o.priority, o.max_attempts, o.key, o.run_at,
          o.context, o.slot_key, o.slots, o.rate_key, o.starts, o.per, o.superseded;

-- name: outbox_take_here
-- relay_in_place's take, inside its transaction: the rows stay locked (a relay beside it skips
-- them) until the same transaction deletes them with their jobs written. Rows a two-step
-- relay holds under a live lease are left to it. $1 now, $2 limit.
SELECT seq, id, name, queue, payload, priority, max_attempts, key, run_at, context, slot_key,
       slots, rate_key, starts, per, ticket, superseded
FROM {schema}.outbox
WHERE claimed_until IS NULL OR claimed_until <= $1
ORDER BY seq
LIMIT $2
FOR UPDATE SKIP LOCKED;

-- name: outbox_delete
-- $2 a relay's ticket: only the rows still marked with it (NULL: any).
DELETE FROM {schema}.outbox
WHERE id = ANY($1::text[]) AND ($2::text IS NULL OR ticket = $2::text)
RETURNING id;

-- name: outbox_present
SELECT id FROM {schema}.outbox WHERE id = ANY($1::text[]);

-- name: outbox_stats
SELECT count(*)::int AS pending, min(created_at) AS oldest FROM {schema}.outbox;

-- name: outbox_holds
SELECT relay_id, count(*)::int AS rows, max(claimed_until) AS until FROM {schema}.outbox
WHERE relay_id IS NOT NULL AND claimed_until IS NOT NULL
GROUP BY relay_id ORDER BY relay_id;

-- name: outbox_source
SELECT id FROM {schema}.outbox_source;

-- name: outbox_probe_write
-- shares_outbox: a fresh value written through the outbox's driver, then read back through the
-- job store's (outbox_probe_read): seen there, the two are one database. A database cloned from
-- the other (CREATE DATABASE ... TEMPLATE) has the same outbox_source id, never this value.
UPDATE {schema}.outbox_source SET probe = $1;

-- name: outbox_probe_read
SELECT probe FROM {schema}.outbox_source;

-- name: relay_ticket
-- A relay's ticket, recorded before it takes a row under it; stale tickets forgotten on the way.
WITH stale AS (
    DELETE FROM {schema}.relay_tickets WHERE stale_at <= $1
)
INSERT INTO {schema}.relay_tickets (ticket, source, relay_id, stale_at) VALUES ($2, $3, $4, $5);

-- name: relay_revoke
-- The tickets of the relays that held a batch's rows before: revoked in its write's
-- transaction, first. A ticket its relay is spending right now (its write in flight) is waited
-- for: then gone, and that relay's decisions are what the next statement reads.
DELETE FROM {schema}.relay_tickets WHERE ticket = ANY($1::text[]);

-- name: relay_spend
-- The batch's own ticket, spent by its write: no row, and the write is refused (fenced).
DELETE FROM {schema}.relay_tickets WHERE ticket = $1 RETURNING 1;

-- name: relay_on_record
SELECT id, outcome, holder, decided_at FROM {schema}.outbox_decisions WHERE id = ANY($1::text[]);

-- name: relay_record
-- The decisions of one relay_enqueue, in its transaction. A row another relay decided since
-- this one looked (its lease lapsed mid-pass) conflicts here: fewer ids come back, and the
-- driver rolls the whole write back and makes it again, to answer that relay's decision.
INSERT INTO {schema}.outbox_decisions (id, source, outcome, holder, decided_at)
SELECT n.id, $1, n.outcome, n.holder, $2
FROM unnest($3::text[], $4::text[], $5::text[]) AS n(id, outcome, holder)
ON CONFLICT DO NOTHING
RETURNING id;

-- name: relay_forget
WITH gone AS (
    DELETE FROM {schema}.outbox_decisions WHERE source = $1 AND id = ANY($2::text[]) RETURNING 1
)
SELECT count(*)::int FROM gone;

-- name: relay_forget_any
-- relay_in_place: the rows it deleted leave no decision behind, whoever recorded it.
DELETE FROM {schema}.outbox_decisions WHERE id = ANY($1::text[]);

-- name: relay_decisions
SELECT id FROM {schema}.outbox_decisions
WHERE source = $1 AND decided_at < $2::float8
ORDER BY decided_at
LIMIT $3;

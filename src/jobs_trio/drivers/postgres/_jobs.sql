-- The jobs capability's statements (_jobs.py): enqueue, claim with fleet limits, renew (settle's:
-- _settle_statements.sql).
-- Placeholders and the loading: _postgres_sql.py.

-- name: enqueue
-- New jobs in the caller's order. What turns a row into a no-op is filled in by the loader:
-- this statement's own (enqueue_conflict, below), or the relay's (enqueue_once_conflict in
-- _outbox_relay.sql), which makes `enqueue_once` of it. The queues that gained a job are
-- notified in the same statement (delivered at commit: a rolled-back enqueue wakes nobody).
WITH created AS (
    INSERT INTO {schema}.jobs (
        id, name, queue, state, payload, priority, attempts, max_attempts,
        run_at, created_at, updated_at, key, slot_key, slots, rate_key, starts, per, context
    )
    SELECT n.id, n.name, n.queue, 'ready', n.payload, n.priority, 0, n.max_attempts,
           $1 + greatest(n.delay, 0), $1, $1, n.key, n.slot_key, n.slots, n.rate_key, n.starts,
           n.per, n.context
    FROM unnest(
        $2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::int[], $8::float8[],
        $9::text[], $10::text[], $12::text[], $13::int[], $14::text[], $15::int[], $16::float8[]
    ) WITH ORDINALITY AS n(
        id, name, queue, payload, priority, max_attempts, delay, key, context,
        slot_key, slots, rate_key, starts, per, ord
    )
    ORDER BY n.ord
    {on_conflict}
    RETURNING id, queue
), notified AS (
    SELECT pg_notify($11, queue) FROM (SELECT DISTINCT queue FROM created) AS woken
)
SELECT id FROM created, (SELECT count(*) FROM notified) AS sent;

-- name: enqueue_conflict
-- (A piece of `enqueue`.) A key a live job already holds turns its row into a no-op: the
-- partial unique index decides, so two racing enqueues cannot both win.
ON CONFLICT (key) WHERE key IS NOT NULL AND state IN {live_states}
DO NOTHING;

-- name: enqueue_one
-- `enqueue` for one job, its parameters in the same order as scalars. Apart because the batch
-- form's unnest, ordinality and DISTINCT cost a single enqueue call a quarter of its time
-- (0.92 against 0.69 ms a statement, commit included, on plain asyncpg: bench/enqueue_call.py).
WITH created AS (
    INSERT INTO {schema}.jobs (
        id, name, queue, state, payload, priority, attempts, max_attempts,
        run_at, created_at, updated_at, key, slot_key, slots, rate_key, starts, per, context
    )
    VALUES (
        $2::text, $3::text, $4::text, 'ready', $5::text, $6::int, 0, $7::int,
        $1 + greatest($8::float8, 0), $1, $1, $9::text, $12::text, $13::int, $14::text,
        $15::int, $16::float8, $10::text
    )
    ON CONFLICT (key) WHERE key IS NOT NULL AND state IN {live_states}
    DO NOTHING
    RETURNING id, queue
), notified AS (
    SELECT pg_notify($11, queue) FROM created
)
SELECT id FROM created, (SELECT count(*) FROM notified) AS sent;

-- name: lock_keys
-- A key with a window (issue 47): one enqueue of it at a time, to the end of its transaction, so
-- that the next one's look (window_holders, a statement later: a fresh snapshot) sees the job
-- this one wrote, committed. Without it both could look before either wrote, and a job
-- finished at once would then leave the other free to write a second. `$1`: sorted keys (one
-- order everywhere: two batches never wait on each other in a circle); `$2`: the schema's
-- prefix, so that two schemas on one server share no lock.
SELECT pg_advisory_xact_lock(hashtextextended($2 || k, 0)) FROM unnest($1::text[]) AS k;

-- name: window_holders
-- For each job of a key with a window, the newest job of its key created within the window
-- (`$1` now; each job's window in seconds and the finished states it covers, comma-joined),
-- live or in a covered state (rules.in_window): that job holds the key. By jobs_key_created.
-- With the transaction's isolation: above READ COMMITTED its snapshot predates the lock, and
-- the look would miss a holder committed meanwhile (_postgres_plan refuses it).
SELECT w.ord, (
    SELECT j.id FROM {schema}.jobs AS j
    WHERE j.key = w.key AND j.created_at > $1 - w.unique_for
      AND (j.state IN {live_states} OR j.state = ANY(string_to_array(w.states, ',')))
    ORDER BY j.created_at DESC, j.id DESC
    LIMIT 1
) AS holder, current_setting('transaction_isolation') AS isolation
FROM unnest($2::text[], $3::float8[], $4::text[]) WITH ORDINALITY AS w(key, unique_for, states, ord);

-- name: live_key_holders
SELECT key, id FROM {schema}.jobs
WHERE key = ANY($1::text[]) AND state IN {live_states};

-- name: notify
-- One notification per queue that gained claimable work; sent at commit, so a rolled-back
-- enqueue wakes nobody.
SELECT pg_notify($1, q) FROM unnest($2::text[]) AS q;

-- name: claim
-- Lapsed leases handed back, then due jobs claimed, best first, skipping rows another claimer
-- holds. One statement: a claim that commits has handed back the lapsed jobs it found too, and
-- one that fails has done neither (never a committed claim whose caller lost its answer to a
-- failed second statement).
-- * `lapsed`/`handed_back`: up to $3 jobs whose lease lapsed by $10 (now, or -Infinity for none at
--   all: Driver.claim's rescue=False, a worker just back from an outage, outage.py) go back at
--   their place in line. Taken ahead and never started (rules.hands_back_lapse, while their
--   ahead_lapses are under max_attempts) as they were; every other one orphaned by the rule
--   (rules.orphaning, said here in SQL): its attempt given back and one more orphaning, or
--   dead-lettered when it ran alone ($7, X_KILLED_WORKER) or reached {orphan_limit} orphanings
--   ($11, X_ORPHANED), its history recorded (`orphaned_history`). This statement's snapshot
--   predates the hand-back, so a statement that hands any job back claims nothing: the driver
--   claims at once with a statement of its own that hands none back (PostgresDriver.claim),
--   whose snapshot sees them at their place in line, as the other drivers' claim does (a job
--   orphaned ahead of others takes its fleet slot or its queue's cap before them).
-- * each queue's due jobs are read in claim order straight off jobs_waiting, an index walk that
--   stops after $8's cap of the queue (one OR over two kinds of candidate once made PostgreSQL
--   read and sort EVERY waiting row: 35 ms a claim with 20,000 queued). The pool runs with
--   enable_sort off (postgres_pool.PLANNER_SETTINGS): with statistics that do not know yet that
--   a queue is deep, sorting looks as cheap as the walk.
-- * suspects (orphaned twice, rules.SUSPECT_AT) are left out of that walk; a claim alone ($13)
--   first looks for one off jobs_suspects (0029) and, when there is one, takes it and nothing
--   else (a one-time filter: the walk then does not run).
-- * the rows are then changed by primary key through `id = ANY(ARRAY(...))`. Joined to the
--   candidates instead (`UPDATE ... FROM candidates`), a generic plan guesses LIMIT $3 at a
--   tenth of the waiting rows and hash-joins them over a sequential scan of the whole table:
--   340 ms a claim with 1,000,000 waiting. An array can only be probed through the index.
-- * one claim serves all of a worker's queues (issue 20): $8 is each queue's cap (its free
--   slots), $3 the total, so a deep queue never takes another queue's slots.
-- * a candidate with fleet limits (issue 15) is not claimed here but answered with a NULL token:
--   the driver decides it in a transaction of its own (claim_limited_*), so a queue without
--   limits never pays for them.
-- * $9 is each queue's free slots: its candidates past that many are claimed ahead (`ahead`).
-- * a paused queue (queue_pauses) is left out before its rows are read: nothing of it is
--   claimed, due or lapsed. Reading the table takes its lock, which `pause_queue` waits for and
--   holds: a claim is ordered before a pause or after it (and then sees it), never beside it.
WITH lapsed AS MATERIALIZED (
    SELECT l.id, l.priority, l.run_at, l.attempts, l.worker_id, l.attempt_seq,
           l.ahead AND l.ahead_lapses < l.max_attempts AS unstarted
    FROM unnest($2::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at, attempts, worker_id, attempt_seq, ahead, ahead_lapses,
               max_attempts
        FROM {schema}.jobs
        WHERE queue = q.name AND state = 'running' AND lease_until <= $10
          {not_settling}
        ORDER BY priority, run_at, id
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    ) AS l
    WHERE q.name NOT IN (SELECT queue FROM {schema}.queue_pauses)
    ORDER BY l.priority, l.run_at, l.id
    LIMIT $3
), handed_back AS (
    -- SET reads the row as it was. The dead-lettered keep their attempt: they are to blame.
    UPDATE {schema}.jobs AS j
    SET state = CASE
            WHEN j.ahead AND j.ahead_lapses < j.max_attempts THEN 'ready'
            WHEN j.alone OR j.orphans + 1 >= {orphan_limit} THEN 'dead'
            WHEN j.cancel_requested THEN 'cancelled'
            ELSE 'ready' END,
        attempts = j.attempts - CASE
            WHEN j.ahead AND j.ahead_lapses < j.max_attempts THEN 1
            WHEN j.alone OR j.orphans + 1 >= {orphan_limit} THEN 0
            ELSE 1 END,
        last_error = CASE
            WHEN j.ahead AND j.ahead_lapses < j.max_attempts THEN $6
            WHEN j.alone THEN $7
            WHEN j.orphans + 1 >= {orphan_limit} THEN $11
            WHEN j.cancel_requested THEN $14
            ELSE replace($12, '{orphans}', (j.orphans + 1)::text) END,
        orphans = j.orphans + CASE WHEN j.ahead AND j.ahead_lapses < j.max_attempts THEN 0 ELSE 1 END,
        ahead_lapses = j.ahead_lapses + CASE
            WHEN j.ahead AND j.ahead_lapses < j.max_attempts THEN 1 ELSE 0 END,
        attempt_seq = j.attempt_seq + CASE
            WHEN j.ahead AND j.ahead_lapses < j.max_attempts THEN 0 ELSE 1 END,
        -- A cancel ended it; a dead job keeps the flag (retry clears it).
        cancel_requested = j.cancel_requested AND NOT (j.ahead AND j.ahead_lapses < j.max_attempts)
            AND (j.alone OR j.orphans + 1 >= {orphan_limit}),
        ahead = false, alone = false, token = NULL, lease_until = NULL, worker_id = NULL,
        updated_at = $1
    WHERE j.id = ANY (ARRAY(SELECT id FROM lapsed))
    RETURNING j.id, j.name, j.state, j.orphans, j.attempt_seq, j.last_error
), orphaned_history AS (
    -- The ended attempt's record (rules.orphaned_record): the attempt and worker the row named,
    -- no run time (nobody saw it end). Runs although nothing reads it.
    INSERT INTO {schema}.attempts AS a
        (job_id, slot, seq, attempt, outcome, worker_id, seconds, ended_at, error, traceback)
    SELECT r.id, r.attempt_seq % {attempt_history}, r.attempt_seq, l.attempts,
           CASE WHEN r.state = 'dead' THEN 'dead-lettered' ELSE 'orphaned' END,
           l.worker_id, NULL, $1, r.last_error, NULL
    FROM handed_back AS r JOIN lapsed AS l ON l.id = r.id
    WHERE NOT l.unstarted
    ON CONFLICT (job_id, slot) DO UPDATE
    SET seq = excluded.seq, attempt = excluded.attempt, outcome = excluded.outcome,
        worker_id = excluded.worker_id, seconds = excluded.seconds,
        ended_at = excluded.ended_at, error = excluded.error, traceback = excluded.traceback
), {claim_takes}
-- name: claim_answer
-- The claims, the limited candidates (NULL token), and the jobs handed back (`released` says
-- what they became: ready, cancelled or dead, or `unstarted` for a job taken ahead handed back as
-- it was; `attempts` is the attempt that ended, `context` the worker
-- it ended on, `payload` its last_error), for the driver's log line.
{claim_answer_takes}
UNION ALL
SELECT r.id, NULL, r.name, NULL, r.last_error, l.attempts, NULL, NULL, l.priority, l.run_at,
       l.worker_id, false, false, CASE WHEN l.unstarted THEN 'unstarted' ELSE r.state END,
       r.orphans
FROM handed_back AS r JOIN lapsed AS l ON l.id = r.id
ORDER BY priority, run_at, id;

-- name: claim_unrescued
-- `claim` with no lapsed job to hand back (Driver.claim's rescue=False): the same candidates,
-- suspect and claimed rows and the same answer's columns, without the lapsed walk, the hand-back
-- and its history. A worker rescues a queue's lapsed jobs once a second at most
-- (claim_loop.RESCUE_EVERY; a tenth of a second while its rescuing claims come back full,
-- RESCUE_AGAIN), and its other claims are this one: the server's work for a claim is most of an idle worker's
-- wake-up, and its plan's size (three modifying CTEs, every index of jobs opened twice, the
-- locks a generic plan takes at bind) was ~0.2 ms of it (bench/RESULTS.md, issue 44).
-- `params` is never read (PostgreSQL drops it): it gives the parameters this claim does not use
-- their types, so that every claim statement takes the same fourteen (settle_claim_* too).
WITH params AS (SELECT $6::text, $7::text, $10::float8, $11::text, $12::text, $14::text),
{claim_takes}

-- name: claim_unrescued_answer
-- `claim_answer` without its hand-backs (there are none).
{claim_answer_takes}
ORDER BY priority, run_at, id;

-- name: claim_takes
-- What every claim statement takes after its lapsed jobs, if any: a suspect alone ($13) or due
-- jobs best first, and the claimed rows. In `claim` nothing is taken beside a lapsed job
-- handed back (its statement's snapshot predates the hand-back): its two guards for that
-- stand where the placeholder for them stands here.
suspect AS MATERIALIZED (
    -- Ahead as any claim's first job of its queue is: when its queue has no free slot ($9).
    SELECT s.id, s.priority, s.run_at, s.limited, q.free < 1 AS ahead
    FROM unnest($2::text[], $9::int[]) AS q(name, free)
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at, slot_key IS NOT NULL OR rate_key IS NOT NULL AS limited
        FROM {schema}.jobs
        WHERE queue = q.name AND state IN {waiting_states} AND run_at <= $1
          AND orphans >= {suspect_at}
        ORDER BY priority, run_at, id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ) AS s
    WHERE $13 AND q.name NOT IN (SELECT queue FROM {schema}.queue_pauses){after_lapsed}
    ORDER BY s.priority, s.run_at, s.id
    LIMIT 1
), candidates AS MATERIALIZED (
    SELECT id, priority, run_at, limited, ahead FROM suspect
    UNION ALL
    (SELECT c.id, c.priority, c.run_at, c.limited, c.ahead
    FROM unnest($2::text[], $8::int[], $9::int[]) AS q(name, n, free)
    CROSS JOIN LATERAL (
        SELECT w.id, w.priority, w.run_at, w.limited,
               row_number() OVER (ORDER BY w.priority, w.run_at, w.id) > q.free AS ahead
        FROM (
            SELECT id, priority, run_at,
                   slot_key IS NOT NULL OR rate_key IS NOT NULL AS limited
            FROM {schema}.jobs
            WHERE queue = q.name AND state IN {waiting_states} AND run_at <= $1
              AND orphans < {suspect_at}
            ORDER BY priority, run_at, id
            LIMIT q.n
            FOR UPDATE SKIP LOCKED
        ) AS w
    ) AS c
    WHERE q.name NOT IN (SELECT queue FROM {schema}.queue_pauses)
      AND NOT EXISTS (SELECT 1 FROM suspect){after_lapsed}
    ORDER BY c.priority, c.run_at, c.id
    LIMIT $3)
), claimed AS (
    UPDATE {schema}.jobs AS j
    SET state = 'running',
        attempts = j.attempts + 1,
        -- IN, not `= ANY (ARRAY(...))`: a hashed subplan, where the array was searched row by
        -- row (64 rows against 64 ids: +0.5 ms a claim, ~8 µs of the server's CPU a job).
        ahead = j.id IN (SELECT id FROM candidates WHERE ahead),
        -- A suspect is only ever a claim's one candidate (above): it runs alone.
        alone = j.orphans >= {suspect_at},
        lease_until = $1::float8 + $4::float8,
        worker_id = $5,
        token = gen_random_uuid()::text,
        wait_event = NULL,
        wait_key = NULL,
        updated_at = $1
    WHERE j.id = ANY (ARRAY(SELECT id FROM candidates WHERE NOT limited))
    RETURNING j.id, j.token, j.name, j.queue, j.payload, j.attempts, j.max_attempts,
              j.lease_until, j.priority, j.run_at, j.context, j.ahead, j.alone
)

-- name: claim_answer_takes
-- The claims, and the limited candidates (NULL token): the answer's first rows.
SELECT id, token, name, queue, payload, attempts, max_attempts, lease_until, priority, run_at,
       context, ahead, alone, NULL::text AS released, NULL::int AS orphans
FROM claimed
UNION ALL
SELECT id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, priority, run_at, NULL, false, false,
       NULL, NULL
FROM candidates WHERE limited

-- name: claim_limited_jobs
-- The limited candidates of a claim, locked again in a transaction of their own (claim order;
-- another claimer may have taken one since: skipped) with the limits their rows carry.
-- A queue paused since the claim's statement is left out, as the claim leaves one out.
SELECT id, state, slot_key, slots, rate_key, starts, per FROM {schema}.jobs
WHERE id = ANY($2::text[]) AND state IN {waiting_states} AND run_at <= $1
  AND queue NOT IN (SELECT queue FROM {schema}.queue_pauses)
ORDER BY priority, run_at, id
FOR UPDATE SKIP LOCKED;

-- name: limit_rows_create
-- A key's rows 1..N, created the first time a claim meets it (in key order, so two claims
-- creating rows never wait on each other in a cycle); an existing row is left as it is.
INSERT INTO {schema}.limit_rows (kind, key, n)
SELECT k.kind, k.key, g.n FROM unnest($1::text[], $2::text[], $3::int[]) AS k(kind, key, n)
CROSS JOIN LATERAL generate_series(1, k.n) AS g(n)
WHERE NOT EXISTS (
    SELECT 1 FROM {schema}.limit_rows AS r WHERE (r.kind, r.key, r.n) = (k.kind, k.key, g.n)
)
ORDER BY 1, 2, 3
ON CONFLICT DO NOTHING;

-- name: claim_limited_rows
-- Every limit row of these keys, locked: a row another claim holds locked right now is skipped,
-- and its key treated as busy (_limit_rules.py), never waited for.
SELECT kind, key, n, until, token, job_id FROM {schema}.limit_rows
WHERE (kind, key) IN (SELECT kind, key FROM unnest($1::text[], $2::text[]) AS k(kind, key))
ORDER BY kind, key, n
FOR UPDATE SKIP LOCKED;

-- name: claim_limited_take
-- The rows the grants took, the jobs put off, and the granted jobs claimed: one statement
-- (`taken` and `put_off` run although nothing reads them, as every data-modifying WITH does).
WITH taken AS (
    UPDATE {schema}.limit_rows AS r SET until = t.until, token = t.token, job_id = t.job_id
    FROM unnest($1::text[], $2::text[], $3::int[], $4::float8[], $5::text[], $6::text[])
        AS t(kind, key, n, until, token, job_id)
    WHERE (r.kind, r.key, r.n) = (t.kind, t.key, t.n)
    RETURNING r.n
), put_off AS (
    -- A lapsed job put off goes back to ready, its lapse recorded (its attempt stays counted).
    UPDATE {schema}.jobs AS j
    SET run_at = p.run_at, waiting_on = p.waits, updated_at = $7,
        last_error = CASE WHEN j.state = 'running' THEN $11 ELSE j.last_error END,
        state = CASE WHEN j.state = 'running' THEN 'ready' ELSE j.state END,
        token = NULL, lease_until = NULL, worker_id = NULL
    FROM unnest($8::text[], $9::float8[], $10::text[]) AS p(id, run_at, waits)
    WHERE j.id = p.id
    RETURNING j.id
)
UPDATE {schema}.jobs AS j
SET state = 'running',
    attempts = j.attempts + 1,
    alone = j.orphans >= {suspect_at},  -- a suspect is only ever claimed alone (see claim)
    lease_until = $7::float8 + $12::float8,
    worker_id = $13,
    token = g.token,
    last_error = CASE WHEN j.state = 'running' THEN $11 ELSE j.last_error END,
    wait_event = NULL,
    wait_key = NULL,
    waiting_on = NULL,
    updated_at = $7
FROM unnest($14::text[], $15::text[]) AS g(id, token)
WHERE j.id = g.id
RETURNING j.id, j.token, j.name, j.queue, j.payload, j.attempts, j.max_attempts, j.lease_until,
          j.context, false AS ahead, j.run_at, j.alone;

-- name: renew
-- Lock in id order first: a worker renews and settles on two connections at once, and two
-- statements locking the same rows in different orders would deadlock. The rows are found by
-- `id = ANY($3)`, probes of the primary key that come out in id order; joined to the unnest
-- instead, with sorts off the planner walked the WHOLE primary key to get that order.
-- SKIP LOCKED: a row another session holds locked (an operator's transaction left open) is
-- answered `busy` below instead of waited for. Waited for, the lock timeout failed the whole
-- statement, and one locked row cost every run of the worker its renewal, then its lease.
WITH held AS MATERIALIZED (
    SELECT j.id FROM {schema}.jobs AS j
    WHERE j.id = ANY ($3::text[]) AND j.state = 'running'
      AND (j.id, j.token) IN (SELECT l.id, l.token FROM unnest($3::text[], $4::text[]) AS l(id, token))
    ORDER BY j.id
    -- NO KEY UPDATE, all an UPDATE of these columns needs: it still waits for (here, skips) a
    -- claim's, a settle's or an operator's FOR UPDATE, but not a step recording itself (FOR KEY
    -- SHARE, save_step), which would otherwise cost the run its renewal.
    FOR NO KEY UPDATE OF j SKIP LOCKED
)
-- A run's fleet slot row renews with it; a run with a slot whose row another run took (its lease
-- lapsed) answers slot_lost.
, renewed AS (
    UPDATE {schema}.jobs AS j
    SET lease_until = $1::float8 + $2::float8, updated_at = $1,
        -- $5: the claims ahead whose bodies have started since: their attempts count now.
        ahead = j.ahead AND NOT (j.token = ANY ($5::text[]))
    WHERE j.id = ANY (ARRAY(SELECT id FROM held))
    RETURNING j.token, j.cancel_requested, j.slot_key IS NOT NULL AS has_slot
), kept AS (
    UPDATE {schema}.limit_rows AS r SET until = $1::float8 + $2::float8
    -- `(…) IS TRUE`: a condition no index answers, so the run's token (limit_rows_token) finds
    -- the row. As a plain `r.kind = 'slot'`, a plan made on an empty table's statistics (all
    -- indexes tie) read every slot row through the primary key instead.
    WHERE r.token = ANY (ARRAY(SELECT token FROM renewed WHERE has_slot)) AND (r.kind = 'slot') IS TRUE
    RETURNING r.token
)
SELECT token, cancel_requested,
       has_slot AND token NOT IN (SELECT token FROM kept) AS slot_lost, false AS busy
FROM renewed
UNION ALL
-- Skipped for its lock, and still this run's in the statement's snapshot: not lost, not renewed.
-- Looked for only when fewer rows were locked than asked (a one-time filter).
SELECT j.token, false, false, true FROM {schema}.jobs AS j
WHERE (SELECT count(*) FROM held) < cardinality($3::text[])
  AND j.id = ANY ($3::text[]) AND j.state = 'running'
  AND (j.id, j.token) IN (SELECT l.id, l.token FROM unnest($3::text[], $4::text[]) AS l(id, token))
  AND j.id NOT IN (SELECT id FROM held);

-- name: hand_back_unheld
-- A claim whose answer its worker never received may have committed: its jobs run under that
-- worker with tokens it does not hold. Made lapsed now and marked ahead, the next claim takes
-- them with their attempts given back (the claim's lapsed walk), as for a held job whose worker
-- died before its start was recorded. Running rows of the worker's queues, by jobs_leased; a
-- row another session holds is skipped (a claim taking it now, if it had lapsed already).
WITH unheld AS MATERIALIZED (
    SELECT id FROM {schema}.jobs
    WHERE queue = ANY($3::text[]) AND state = 'running' AND worker_id = $2
      AND NOT (token = ANY ($4::text[]))
    ORDER BY id
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs AS j SET ahead = true, lease_until = $1, updated_at = $1
WHERE j.id = ANY (ARRAY(SELECT id FROM unheld))
RETURNING j.id;

-- name: unmark_alone
-- A suspect's run its worker abandoned at a drain's grace is no longer alone: its lapse then
-- orphans it instead of dead-lettering it (the abandonment, not the job, ended that worker).
-- Only the mark, fenced by (id, token): lease_until stays, so nobody claims it before it lapses.
-- Locked in id order, as renew locks them (both run on the worker's connections at once); not
-- SKIP LOCKED: a row held by this worker's own renewal is waited for, not left marked.
WITH held AS MATERIALIZED (
    SELECT j.id FROM {schema}.jobs AS j
    WHERE j.id = ANY ($1::text[]) AND j.state = 'running'
      AND (j.id, j.token) IN (SELECT l.id, l.token FROM unnest($1::text[], $2::text[]) AS l(id, token))
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
)
UPDATE {schema}.jobs AS j SET alone = false
WHERE j.id = ANY (ARRAY(SELECT id FROM held))
RETURNING j.id;

-- name: next_due
-- The earliest moment a job in these queues may become claimable: a run-at, or a lease that
-- will lapse, not before $2 (-Infinity, or when a worker back from an outage rescues again).
-- least() and greatest() skip NULLs; NULL overall means nothing is coming. One index probe per
-- queue and kind (LIMIT 1 on (queue, run_at) and (queue, lease_until)): min() over
-- `queue = ANY(...)` read every waiting row of those queues instead. A paused queue's jobs are
-- no work: its resume notifies its waiters. A suspect (orphaned twice) is work only for a waiter
-- alone ($3, Driver.wait_for_work): the run-at walk reads past the others in run-at order.
WITH asked AS MATERIALIZED (
    SELECT name FROM unnest($1::text[]) AS q(name)
    WHERE name NOT IN (SELECT queue FROM {schema}.queue_pauses)
)
SELECT least(
    (SELECT min(w.run_at) FROM asked AS q CROSS JOIN LATERAL (
        SELECT run_at FROM {schema}.jobs
        WHERE queue = q.name AND state IN {waiting_states} AND (orphans < {suspect_at} OR $3)
        ORDER BY run_at LIMIT 1
    ) AS w),
    -- Not greatest(min(...), $2): greatest() skips a NULL, and no lease at all read as $2.
    (SELECT CASE WHEN min(l.lease_until) < $2::float8 THEN $2::float8 ELSE min(l.lease_until) END
     FROM asked AS q CROSS JOIN LATERAL (
        SELECT lease_until FROM {schema}.jobs
        WHERE queue = q.name AND state = 'running'
        ORDER BY lease_until LIMIT 1
    ) AS l)
);

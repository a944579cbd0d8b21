-- The settle statements of the jobs capability (_settle_statements.py encodes their batches):
-- the frame every kind's settle shares and each kind's rows and changes. Placeholders and the
-- loading: _postgres_sql.py, which also makes each settle_claim_<kind> of them.

-- name: lock_for_settle
-- A batch of several kinds runs one statement per kind in one transaction: lock all its rows in
-- id order first, or two kinds' statements could take them in an order a renew crosses.
SELECT id FROM {schema}.jobs WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE;

-- name: settle
-- The frame of every kind's settle statement: settle_<kind>_rows below is the unnest of the
-- batch, settle_<kind>_set what that kind changes. Fenced: only a row whose token is still the
-- claim's changes. $1 now, $2 the NOTIFY channel, $3 ids, $4 tokens, $5 whether each hands
-- its attempt back (rules.SETTLEMENT_KINDS decides), $6… the kind's own (settle_columns), then
-- the attempt notes' columns ({note_columns}: _postgres_sql.py numbers them after the kind's).
-- $3, $4, $5 and the notes' text columns come as one array literal each ('{a,b}'), cast here
-- ($3::text::text[]): _settle_statements.py's _text_array says why.
WITH locked AS MATERIALIZED (
    -- In id order: a worker renews and settles on two connections at once (see renew).
    -- {skip_locked}: a settle alone skips a row another session holds locked (answered busy)
    -- rather than wait for it holding the batch's other rows, whose renewals then see them
    -- locked; the driver then writes the busy ones waiting (settle_wait_<kind>: most are a
    -- moment's lock, a concurrent claim's that read the row as ready). One carried by a claim
    -- waits (its claim must commit whole), at most the lock timeout, and the worker then gives
    -- its settlements to a settle alone.
    SELECT id FROM {schema}.jobs WHERE id = ANY($3::text::text[]) ORDER BY id FOR UPDATE{skip_locked}
), settled AS (
    UPDATE {schema}.jobs AS j
    SET {kind_set},
        -- An operator's pending cancel ends the job cancelled instead, its attempt counted.
        attempts = j.attempts - CASE WHEN s.handed_back AND NOT j.cancel_requested THEN 1 ELSE 0 END,
        token = NULL, lease_until = NULL, worker_id = NULL, cancel_requested = false,
        alone = false, updated_at = $1, attempt_seq = j.attempt_seq + 1
    FROM ({kind_rows}) AS s
    -- The batch's rows by primary key (`= ANY (ARRAY(...))`, an index condition), or, in a
    -- plan made while few jobs ran (a fresh table's), off jobs_leased, the running ones, each
    -- tested by a hashed probe of `locked` first. Joined to the batch by token (unique to one
    -- claim of one job). `IS TRUE` keeps the probe and the id test out of the planner's joins
    -- (issue 44): a bare IN was pulled up into a semi-join, which a plan on such statistics
    -- made a nested loop rescanning `locked` for each row of the batch, forming a whole-row
    -- copy of each row it read, quadratic in the batch (~20% of the server's CPU a job at
    -- c=50, bench/server_cpu.py); a bare id join let a plan made on an empty table walk the
    -- whole primary key (tests/drivers/test_postgres_plans.py has each case).
    WHERE j.id = ANY (ARRAY(SELECT id FROM locked)) AND (j.id IN (SELECT id FROM locked)) IS TRUE
      AND j.token = s.token AND (j.id = s.id) IS TRUE AND j.state = 'running'
    RETURNING j.id, s.token, j.queue, s.ready_now AND j.state <> 'cancelled' AS ready_now,
              j.slot_key IS NOT NULL AS has_slot, j.state, j.last_error, j.attempt_seq
), released AS (
    -- A settled run's fleet slot is free in the settle's own transaction (fenced: only a row
    -- its token still holds), and the first job a claim put off waiting on it is due now.
    UPDATE {schema}.limit_rows AS r SET until = NULL, token = NULL, job_id = NULL
    -- (r.kind = 'slot') IS TRUE: found by token, never by kind (see renew's `kept`).
    WHERE r.token = ANY (ARRAY(SELECT token FROM settled WHERE has_slot)) AND (r.kind = 'slot') IS TRUE
    RETURNING r.key
), woken AS (
    UPDATE {schema}.jobs AS w SET run_at = $1, updated_at = $1
    WHERE w.id = ANY (ARRAY(
        -- One waiter per slot freed: the statement sees one snapshot, so per key, not per row.
        SELECT f.id FROM (SELECT key, count(*) AS n FROM released GROUP BY key) AS r
        CROSS JOIN LATERAL (
            SELECT id FROM {schema}.jobs
            WHERE waiting_on = 'slot:' || r.key AND state IN {waiting_states}
              AND run_at > $1
            ORDER BY priority, run_at, id
            LIMIT r.n
            FOR UPDATE SKIP LOCKED
        ) AS f
    ))
    RETURNING w.queue
), notified AS (
    -- A job ready again at once (an interrupted attempt, a drain, a slot's waiter) is for any
    -- worker to take.
    SELECT pg_notify($2, queue) FROM (
        SELECT queue FROM settled WHERE ready_now UNION SELECT queue FROM woken
    ) AS w
), recorded AS (
    -- The attempt's history record, for a settlement given with a note (rules.history_record
    -- says the same for the other drivers): in its ring slot, replacing the oldest record
    -- there. The row's new state tells an operator's pending cancel ended it cancelled; its
    -- error is the text the ending stored. Runs although nothing reads it.
    INSERT INTO {schema}.attempts AS a
        (job_id, slot, seq, attempt, outcome, worker_id, seconds, ended_at, error, traceback)
    SELECT st.id, st.attempt_seq % {attempt_history}, st.attempt_seq, h.attempt,
           CASE WHEN st.state = 'cancelled' THEN 'cancelled' ELSE h.outcome END,
           h.worker_id, h.seconds, $1,
           CASE WHEN st.state = 'cancelled' OR h.outcome NOT IN ('completed', 'suspended')
                THEN st.last_error END,
           h.traceback
    FROM settled AS st
    JOIN unnest($3::text::text[], $4::text::text[], {note_columns})
        AS h(id, token, attempt, outcome, worker_id, seconds, traceback)
        ON h.id = st.id AND h.token = st.token
    WHERE h.attempt IS NOT NULL
    ON CONFLICT (job_id, slot) DO UPDATE
    SET seq = excluded.seq, attempt = excluded.attempt, outcome = excluded.outcome,
        worker_id = excluded.worker_id, seconds = excluded.seconds,
        ended_at = excluded.ended_at, error = excluded.error, traceback = excluded.traceback
)
-- name: settle_answer
SELECT id, token, false AS busy FROM settled, (SELECT count(*) FROM notified) AS sent
UNION ALL
-- Skipped for its lock, and still this claim's in the statement's snapshot: not written, and
-- not fenced either. Looked for only when some row was not locked (a one-time filter): the
-- usual batch pays nothing for it.
SELECT j.id, j.token, true FROM {schema}.jobs AS j
WHERE (SELECT count(*) FROM locked) < cardinality($3::text::text[])
  AND j.id = ANY ($3::text::text[]) AND j.state = 'running'
  AND (j.id, j.token) IN (SELECT u.id, u.token FROM unnest($3::text::text[], $4::text::text[]) AS u(id, token))
  AND j.id NOT IN (SELECT id FROM locked);

-- name: settle_complete_rows
SELECT *, false AS ready_now
FROM unnest($3::text::text[], $4::text::text[], $5::text::bool[], $6::text::text[])
    AS u(id, token, handed_back, result);

-- name: settle_complete_set
state = 'completed', result = s.result;

-- name: settle_retry_rows
-- A NULL delay: an interrupted attempt, ready now at the run_at it had (its place in line).
SELECT *, coalesce(delay, 0) <= 0 AS ready_now
FROM unnest($3::text::text[], $4::text::text[], $5::text::bool[], $6::float8[], $7::text[], $8::text[])
    AS u(id, token, handed_back, delay, error, cancelled);

-- name: settle_retry_set
-- Here and in suspend and park: an operator's pending cancel ends the job cancelled instead,
-- its attempt counted and s.cancelled its error (operator_transitions.cancel_instead, which
-- holds the rule); in this one statement, so a cancel request that commits while it runs is
-- seen on the row it re-reads.
state = CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'ready' END,
run_at = CASE WHEN j.cancel_requested OR s.delay IS NULL THEN j.run_at
              ELSE $1 + greatest(s.delay, 0) END,
last_error = CASE WHEN j.cancel_requested THEN s.cancelled ELSE s.error END;

-- name: settle_dead_rows
SELECT *, false AS ready_now
FROM unnest($3::text::text[], $4::text::text[], $5::text::bool[], $6::text[]) AS u(id, token, handed_back, error);

-- name: settle_dead_set
state = 'dead', last_error = s.error;

-- name: settle_suspend_rows
-- $8 the event key each waits for (NULL: any), $10 the snapshot of each suspension's look
-- (NULL: no look). `woken`: an event of the name committed that the look could not see (sent
-- while the job ran, when it woke nothing), or one committing at this moment; the job is
-- ready now instead, as the send would have left it (suspend_sees_event, in migration 0014;
-- rules.woken holds the rule). OFFSET 0 keeps the subquery whole: flattened, each use of
-- `woken` called the function again.
SELECT *, delay <= 0 OR woken AS ready_now
FROM (
    SELECT u.*, {schema}.suspend_sees_event(u.event, u.match, u.seen) AS woken
    FROM unnest($3::text::text[], $4::text::text[], $5::text::bool[], $6::float8[], $7::text[], $8::text[],
                $9::text[], $10::text[])
        AS u(id, token, handed_back, delay, event, match, cancelled, seen)
    OFFSET 0
) AS u;

-- name: settle_suspend_set
-- A pending cancel: see retry.
state = CASE WHEN j.cancel_requested THEN 'cancelled' WHEN s.woken THEN 'ready'
             ELSE 'suspended' END,
run_at = CASE WHEN j.cancel_requested THEN j.run_at WHEN s.woken THEN $1
              ELSE $1 + greatest(s.delay, 0) END,
wait_event = CASE WHEN j.cancel_requested THEN j.wait_event ELSE s.event END,
wait_key = CASE WHEN j.cancel_requested THEN j.wait_key ELSE s.match END,
last_error = CASE WHEN j.cancel_requested THEN s.cancelled ELSE j.last_error END;

-- name: settle_park_rows
SELECT *, false AS ready_now
FROM unnest($3::text::text[], $4::text::text[], $5::text::bool[], $6::text[], $7::text[])
    AS u(id, token, handed_back, reason, cancelled);

-- name: settle_park_set
-- Parked for deploy skew (a job name this deploy does not know). A pending cancel: see retry.
state = CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'parked' END,
last_error = CASE WHEN j.cancel_requested THEN s.cancelled ELSE s.reason END;

-- name: settle_cancel_rows
SELECT *, false AS ready_now
FROM unnest($3::text::text[], $4::text::text[], $5::text::bool[], $6::text[]) AS u(id, token, handed_back, error);

-- name: settle_cancel_set
state = 'cancelled', last_error = s.error;

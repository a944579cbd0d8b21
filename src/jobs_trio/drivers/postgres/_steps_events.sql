-- The steps and events capability's statements (_steps_events.py).
-- Placeholders and the loading: _postgres_sql.py.

-- name: load_steps
-- The columns in _rows.STEP_FIELDS order: _rows.step_record reads them by place.
SELECT name, status, started_at, finished_at, result, wake_at, event, match_key
FROM {schema}.steps WHERE job_id = $1 ORDER BY position;

-- name: save_step
-- Fenced: written only while the token is current. The row lock holds off a concurrent claim or
-- settle (both lock the row FOR UPDATE) until this write lands, so it cannot slip in just after
-- the token changed. Written in a step's own transaction (step.transaction) the lock lasts until
-- that commits: no claim takes the job over in between. FOR KEY SHARE, the weakest lock FOR
-- UPDATE waits for: the run's own renewal (FOR NO KEY UPDATE) passes it, where FOR SHARE made
-- it answer `busy` (not extended) each time it met a step committing.
WITH held AS (
    SELECT id FROM {schema}.jobs
    WHERE id = $1 AND token = $2 AND state = 'running'
    FOR KEY SHARE
)
INSERT INTO {schema}.steps AS s (
    job_id, name, status, started_at, finished_at, result, wake_at, event, match_key
)
SELECT id, $3, $4, $5, $6, $7, $8, $9, $10 FROM held
ON CONFLICT (job_id, name) DO UPDATE
SET status = excluded.status, started_at = excluded.started_at,
    finished_at = excluded.finished_at, result = excluded.result, wake_at = excluded.wake_at,
    event = excluded.event, match_key = excluded.match_key
RETURNING s.job_id;

-- name: send_event
-- Store the event. Its waiters are woken when its transaction COMMITS, by the deferred trigger
-- events_wake (migration 0014): woken here, a send in an application's transaction that
-- commits later would find only the jobs suspended before it, and miss those suspending
-- meanwhile.
INSERT INTO {schema}.events (name, key, payload, created_at) VALUES ($2, $3, $4, $1)
RETURNING id;

-- name: look_for_event
-- The earliest match, and the look's snapshot: its mark (Suspend.seen). An event its settle
-- finds committed but not visible to this snapshot was sent after the look (rules.woken). The
-- event's columns first, in the order _rows.event_record reads them.
SELECT f.id, f.name, f.key, f.payload, f.created_at, pg_current_snapshot()::text AS seen
FROM (SELECT) AS one LEFT JOIN (
    SELECT id, name, key, payload, created_at FROM {schema}.events
    WHERE name = $1 AND ($2::text IS NULL OR key = $2)
      AND ($3::float8 IS NULL OR created_at >= $3)
    ORDER BY id
    LIMIT 1
) AS f ON true;

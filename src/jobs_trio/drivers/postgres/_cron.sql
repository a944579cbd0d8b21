-- The cron capability's statements (_cron.py): each task's mark and the ticks it fired.
-- Placeholders and the loading: _postgres_sql.py.

-- name: task_marks
SELECT task, handled_until, last_fired, last_fired_at, last_job_id
FROM {schema}.task_marks ORDER BY task;

-- name: task_mark_create
-- The compare-and-set from "no record": of two racing creators the unique key lets one in.
INSERT INTO {schema}.task_marks (task, handled_until, updated_at) VALUES ($2, $3, $1)
ON CONFLICT (task) DO NOTHING
RETURNING task;

-- name: task_mark_move
-- The compare-and-set: a racing mover waits on the row lock, then finds the mark moved and
-- matches nothing. The last-fired columns change only when this advance fires ($4 not NULL).
UPDATE {schema}.task_marks
SET handled_until = $3,
    last_fired = coalesce($4, last_fired),
    last_fired_at = CASE WHEN $4::float8 IS NULL THEN last_fired_at ELSE $1 END,
    last_job_id = coalesce($5, last_job_id),
    updated_at = $1
WHERE task = $2 AND handled_until = $6
RETURNING task;

-- name: task_fires_record
-- One row per fire; a time already on record is refused by the key (the caller rolls back).
INSERT INTO {schema}.task_fires (task, scheduled, job_id, fired_at)
SELECT $2, f.scheduled, f.job_id, $1
FROM unnest($3::float8[], $4::text[]) AS f(scheduled, job_id)
ON CONFLICT DO NOTHING
RETURNING scheduled;

-- name: task_fires_prune
-- Keep the newest $2 fires of a task; older times are behind its mark, which refuses them.
DELETE FROM {schema}.task_fires
WHERE task = $1 AND scheduled < (
    SELECT scheduled FROM {schema}.task_fires WHERE task = $1
    ORDER BY scheduled DESC LIMIT 1 OFFSET $2 - 1
);

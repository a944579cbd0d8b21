-- The first schema: jobs, their step records, and events.
-- Times are epoch seconds from the driver's own clock (double precision), never the server's
-- now(): a test on a manual clock and a fleet on wall clocks read the same columns the same way.

CREATE TABLE {schema}.jobs (
    -- "C" collation: ids are hex, and claim order (priority, run_at, id) must not depend on
    -- the server's locale.
    id text COLLATE "C" PRIMARY KEY,
    name text NOT NULL,
    queue text COLLATE "C" NOT NULL,
    state text NOT NULL CHECK (
        state IN ('ready', 'running', 'completed', 'dead', 'suspended', 'parked', 'cancelled')
    ),
    -- JSON kept as text, byte for byte: jsonb would reorder keys and the contract hands back
    -- what was written.
    payload text NOT NULL,
    priority integer NOT NULL,
    attempts integer NOT NULL,
    max_attempts integer NOT NULL,
    run_at double precision NOT NULL,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    key text,
    last_error text,
    result text,
    lease_until double precision,
    worker_id text,
    -- The fencing token of the current claim; NULL when nobody holds the job. Never part of
    -- what operators read.
    token text,
    cancel_requested boolean NOT NULL DEFAULT false,
    wait_event text
);

-- A unique key is held only while its job can still run: the index, not a read-then-write,
-- decides which of two racing enqueues wins.
CREATE UNIQUE INDEX jobs_live_key ON {schema}.jobs (key)
    WHERE key IS NOT NULL AND state IN ('ready', 'running', 'suspended', 'parked');

-- Claim order over what is waiting to run.
CREATE INDEX jobs_waiting ON {schema}.jobs (queue, priority, run_at, id)
    WHERE state IN ('ready', 'suspended');

-- The soonest run-at, for wait_for_work's sleep.
CREATE INDEX jobs_waiting_run_at ON {schema}.jobs (queue, run_at)
    WHERE state IN ('ready', 'suspended');

-- Lapsed leases, for re-claims and for wait_for_work's sleep.
CREATE INDEX jobs_leased ON {schema}.jobs (queue, lease_until) WHERE state = 'running';

-- send_event wakes the jobs suspended on its name.
CREATE INDEX jobs_suspended_on ON {schema}.jobs (wait_event) WHERE state = 'suspended';

-- list_jobs: newest first.
CREATE INDEX jobs_created ON {schema}.jobs (created_at DESC, id DESC);

CREATE TABLE {schema}.steps (
    job_id text COLLATE "C" NOT NULL REFERENCES {schema}.jobs (id) ON DELETE CASCADE,
    name text NOT NULL,
    -- Load order is first-save order, as the memory driver's dict keeps it; a replaced step
    -- keeps its place.
    position bigint GENERATED ALWAYS AS IDENTITY,
    status text NOT NULL,
    started_at double precision NOT NULL,
    finished_at double precision,
    result text,
    wake_at double precision,
    event text,
    match_key text,
    PRIMARY KEY (job_id, name)
);

CREATE TABLE {schema}.events (
    -- The id orders events as they were stored: find_event answers the earliest.
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL,
    key text,
    payload text NOT NULL,
    created_at double precision NOT NULL
);

CREATE INDEX events_by_name ON {schema}.events (name, id);

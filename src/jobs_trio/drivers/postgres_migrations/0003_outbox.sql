-- The outbox: jobs an application wrote in its own transaction, in this database, waiting for
-- a relay to move them into the job store (which may be another database). A row is deleted
-- once its job is stored there; the job keeps the row's id, so a relay that died between the
-- two writes (or two relays taking one row) stores it once.

CREATE TABLE {schema}.outbox (
    -- Relay order: the order rows were written in.
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id text COLLATE "C" NOT NULL UNIQUE,
    name text NOT NULL,
    queue text NOT NULL,
    payload text NOT NULL,
    priority integer NOT NULL,
    max_attempts integer NOT NULL,
    key text,
    -- When the job is due, on the writer's clock: its delay survives the wait in here.
    run_at double precision NOT NULL,
    created_at double precision NOT NULL,
    -- A relay's hold on the row; past it (the relay died) another relay takes it again.
    claimed_until double precision,
    relay_id text
);

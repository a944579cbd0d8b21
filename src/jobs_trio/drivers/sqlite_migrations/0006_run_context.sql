-- The per-run context (issue 15): the application's context (tenant, request id) and the W3C
-- trace context an enqueue stores with its job, as JSON text (run_context.py); NULL: none.
-- The outbox carries it too, so a relayed job keeps the context of the request that wrote it.

ALTER TABLE jobs ADD COLUMN context TEXT;
ALTER TABLE outbox ADD COLUMN context TEXT;

-- The trace context (traceparent, tracestate, sentry-trace, baggage) and the publisher's
-- custom headers of a dead-lettered message, so a replay republishes them and the job's
-- trace goes on where it stopped. NULL for rows written before, or without headers.
ALTER TABLE core.dead_letters ADD COLUMN IF NOT EXISTS headers jsonb;

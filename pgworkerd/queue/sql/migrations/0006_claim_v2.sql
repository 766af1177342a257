-- 0006: claim_v2(), the claim that honours the queues each handler claims from.
-- compatible-with-code-of-schema: 5
--
-- An expand migration (README "Upgrading"): claim() of 0003 stays as it is for daemons
-- of schema 5 (pgworkerd 0.2), which keep running beside the new ones; a later contract
-- migration drops it once no supported release calls it.
--
-- claim_v2 takes claim()'s arguments plus handler_queues: per handler, the queues it
-- claims from (the handler's `queues` setting), or null for every queue of the claim.
-- Everything else is claim()'s, JIT off and search_path pinned included:
--   SELECT * FROM pgworkerd.claim_v2('worker-1', '{default,mail}', '{send_mail,resize}',
--                                    '{300,60}', '{4,4}', 8, NULL, '[["mail"], null]');

CREATE FUNCTION @schema@.claim_v2(
    worker text,
    queues text[],
    handlers text[],
    lease_seconds float8[],         -- per handler: the lease a claimed job gets
    free integer[],                 -- per handler: how many more jobs it may take
    max_jobs integer,               -- in all
    handler_max_attempts integer[] DEFAULT NULL,  -- per handler: overrides the job's own
    -- per handler: a JSON array of the queues (among `queues`) it claims from, or null
    -- for all of them; the whole argument NULL: every handler claims from all of them
    handler_queues jsonb DEFAULT NULL
)
RETURNS TABLE (
    id bigint, queue text, handler text, payload jsonb, priority integer, attempts integer,
    max_attempts integer, lease_token bigint, checkpoint jsonb, run_at timestamptz,
    created_at timestamptz, locked_until timestamptz, rescued boolean
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- SECURITY INVOKER: callers need UPDATE on the jobs table (pgworkerd_daemon has it), so
-- EXECUTE can stay granted to everyone.
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    -- Pending jobs in (priority, run_at, id) order and running jobs whose lease ran out
    -- (the rescue path). Expired jobs that used up their attempts (or were asked to
    -- cancel) are finished instead of run again.
    -- Every argument the planner would look at is read through a scalar sub-select, so
    -- that a custom plan is estimated exactly like the generic one: the plan cache then
    -- settles on the generic plan and stops re-planning on every call (the planning cost
    -- more than the execution). The plan is built to be safe whatever the estimates:
    -- index scans in ORDER BY order with LIMIT, primary-key look-ups for the rest.
    RETURN QUERY
    WITH wanted AS (
        SELECT s.handler, s.lease_seconds, s.free, s.max_attempts,
               -- NULL: every queue of the claim
               CASE WHEN jsonb_typeof((SELECT claim_v2.handler_queues) -> (s.n::integer - 1))
                         = 'array'
                    THEN ARRAY(SELECT jsonb_array_elements_text(
                                   (SELECT claim_v2.handler_queues) -> (s.n::integer - 1)))
               END AS queues
        FROM unnest((SELECT claim_v2.handlers), (SELECT claim_v2.lease_seconds),
                    (SELECT claim_v2.free), (SELECT claim_v2.handler_max_attempts))
             WITH ORDINALITY AS s(handler, lease_seconds, free, max_attempts, n)
    ), served AS (
        SELECT * FROM wanted
        -- a drain takes effect at once, even before the daemon's next heartbeat reads it
        WHERE NOT EXISTS (SELECT 1 FROM @schema@.workers w
                           WHERE w.id = (SELECT claim_v2.worker) AND w.drain_requested)
    ), due AS (
        -- per handler, so a capped handler's backlog cannot hide another handler's jobs
        SELECT d.id, d.priority, d.run_at, s.handler FROM served s CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_at FROM @schema@.jobs j
            WHERE j.status = 'pending' AND j.run_at <= now() AND j.handler = s.handler
              AND j.queue = ANY((SELECT claim_v2.queues)::text[])
              AND (s.queues IS NULL OR j.queue = ANY(s.queues))
            ORDER BY j.priority, j.run_at, j.id
            LIMIT least(s.free, (SELECT claim_v2.max_jobs))
            FOR UPDATE SKIP LOCKED) d
    ), expired AS (
        SELECT j.id, j.priority, j.run_at, j.handler,
               (j.attempts >= j.max_attempts OR j.cancel_requested) AS finished
        FROM @schema@.jobs j
        WHERE j.status = 'running' AND j.locked_until < now()
          AND j.queue = ANY((SELECT claim_v2.queues)::text[])
          AND EXISTS (SELECT 1 FROM wanted s
                       WHERE s.handler = j.handler
                         AND (s.queues IS NULL OR j.queue = ANY(s.queues)))
        ORDER BY j.locked_until
        LIMIT (SELECT claim_v2.max_jobs)
        FOR UPDATE SKIP LOCKED
    ), buried AS (
        UPDATE @schema@.jobs j
           SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                             ELSE 'dead' END::@schema@.job_status,
               last_error = 'lease of ' || j.locked_by || ' expired during attempt '
                            || j.attempts || ' of ' || j.max_attempts || ': the worker was lost',
               locked_by = NULL, locked_until = NULL, finished_at = now(), updated_at = now(),
               -- a fencing event like a claim: the lost holder's token no longer matches
               lease_token = j.lease_token + 1
          FROM expired e
         WHERE j.id = e.id AND e.finished
        RETURNING j.id
    ), chosen AS (
        -- at most `free` per handler, the best first; due and expired jobs carry what the
        -- ranking needs, so the table is not read again here
        SELECT id, rescued, lease_seconds, max_attempts FROM (
            SELECT c.id, c.priority, c.run_at, c.rescued, s.free, s.lease_seconds,
                   s.max_attempts,
                   row_number() OVER (PARTITION BY c.handler
                                      ORDER BY c.priority, c.run_at, c.id) AS n
            FROM (SELECT id, priority, run_at, handler, false AS rescued FROM due
                  UNION ALL
                  SELECT id, priority, run_at, handler, true FROM expired WHERE NOT finished) c
            JOIN served s USING (handler)) ranked
        WHERE n <= free
        ORDER BY priority, run_at, id
        LIMIT (SELECT claim_v2.max_jobs)
    )
    UPDATE @schema@.jobs j
       SET status = 'running',
           locked_by = claim_v2.worker,
           locked_until = now() + make_interval(secs => c.lease_seconds),
           attempts = j.attempts + 1,
           -- a handler's configured max_attempts overrides the job's own
           max_attempts = greatest(j.attempts + 1, coalesce(c.max_attempts, j.max_attempts)),
           lease_token = j.lease_token + 1,
           last_error = CASE WHEN j.status = 'running'
                             THEN 'lease of ' || j.locked_by || ' expired during attempt '
                                  || j.attempts || ': the worker was lost'
                             ELSE j.last_error END,
           started_at = now(),
           updated_at = now()
      FROM chosen c
     -- by primary key, however many rows a generic plan expects
     WHERE j.id = ANY(ARRAY(SELECT id FROM chosen)) AND j.id = c.id
    RETURNING j.id, j.queue, j.handler, j.payload, j.priority, j.attempts, j.max_attempts,
              j.lease_token, j.checkpoint, j.run_at, j.created_at, j.locked_until,
              c.rescued AS rescued;
END;
$$;

-- A handler object's optional keys given as JSON null (issue 26's session): claim_jobs_v3
-- refused them with "cannot cast jsonb null to type integer" although its checks, and
-- docs/guide/other-languages.md, take null as "none" (the daemon leaves such keys out,
-- a worker in another language may not).
-- compatible-with-code-of-schema: 5
--
-- An expand migration: claim_jobs_v3 is replaced with the same text but nullif() before
-- each cast of an optional key (same signature and result: grants kept). The declaration
-- is objects/claim.sql; this is the same text.

CREATE OR REPLACE FUNCTION @schema@.claim_jobs_v3(
    worker text,      -- this worker's name; the finishing functions take it back
    queues text[],    -- the queues to claim from (at most 1,000)
    max_jobs integer, -- at most this many jobs in all (>= 0)
    handlers jsonb    -- one object per handler this worker runs (at most 1,000), above
)
RETURNS TABLE (
    id bigint, queue text, handler text, payload jsonb, priority integer, attempts integer,
    max_attempts integer, lease_token bigint, checkpoint jsonb, run_at timestamptz,
    created_at timestamptz, locked_until timestamptz, rescued boolean,
    timeout_seconds float8, parents jsonb, has_children boolean,
    wait_for text, wait_ended text, signal_payload jsonb, signal_sent_at timestamptz,
    batch jsonb, trace_context jsonb
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- as claim_v3: a backlog's estimated cost would cross jit_above_cost
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    -- The keys a handler object may have. A successor's keys join this list in the same
    -- CREATE OR REPLACE that reads them (absent: today's behaviour).
    known_keys CONSTANT text[] := '{name,lease_seconds,free,max_attempts,queues,max_running,'
                                  'max_running_per_key,fair,weights,rate,rate_per_key}';
    int4_max CONSTANT numeric := 2147483647;
    problem text;
    names text[];
    leases float8[];
    free integer[];
    attempts_over integer[];
    their_queues jsonb;
    running integer[];
    per_key integer[];
    fair boolean[];
    weights jsonb;
    rate float8[];
    rate_per_key float8[];
    claimed_ids bigint[];
    claimed_rescued boolean[];
BEGIN
    problem := CASE
        WHEN claim_jobs_v3.worker IS NULL OR claim_jobs_v3.worker = '' THEN
            'worker must name this worker (the finishing functions take the name back), not '
            || coalesce(quote_literal(claim_jobs_v3.worker), 'NULL')
        WHEN claim_jobs_v3.queues IS NULL OR array_ndims(claim_jobs_v3.queues) > 1
             OR array_position(claim_jobs_v3.queues, NULL) IS NOT NULL THEN
            'queues must be an array of queue names without NULL, not '
            || coalesce(left(claim_jobs_v3.queues::text, 200), 'NULL')
        WHEN cardinality(claim_jobs_v3.queues) > 1000 THEN
            'queues must name at most 1000 queues, not '
            || cardinality(claim_jobs_v3.queues)
        WHEN claim_jobs_v3.max_jobs IS NULL OR claim_jobs_v3.max_jobs < 0 THEN
            'max_jobs must be 0 or more, not ' || coalesce(claim_jobs_v3.max_jobs::text, 'NULL')
        WHEN claim_jobs_v3.handlers IS NULL
             OR jsonb_typeof(claim_jobs_v3.handlers) <> 'array' THEN
            'handlers must be a JSON array of handler objects, not '
            || coalesce(left(claim_jobs_v3.handlers::text, 200), 'NULL')
        WHEN jsonb_array_length(claim_jobs_v3.handlers) > 1000 THEN
            'handlers must hold at most 1000 handlers, not '
            || jsonb_array_length(claim_jobs_v3.handlers)
    END;
    IF problem IS NULL THEN
        -- the first bad handler object, if any (CASE: each test only once the ones
        -- before it passed, so no cast ever sees a value of the wrong type)
        SELECT format('handlers[%s] %s: %s', e.n - 1, left(e.h::text, 200), p.problem)
          INTO problem
          FROM jsonb_array_elements(claim_jobs_v3.handlers) WITH ORDINALITY AS e(h, n)
         CROSS JOIN LATERAL (SELECT CASE
            WHEN jsonb_typeof(e.h) <> 'object' THEN 'each handler must be a JSON object'
            WHEN EXISTS (SELECT FROM jsonb_object_keys(e.h) k WHERE k <> ALL (known_keys))
                THEN 'unknown key(s) '
                     || (SELECT string_agg(quote_literal(k), ', ' ORDER BY k)
                           FROM jsonb_object_keys(e.h) k WHERE k <> ALL (known_keys))
                     || ': a handler object takes ' || array_to_string(known_keys, ', ')
            WHEN CASE jsonb_typeof(e.h -> 'name')
                     WHEN 'string' THEN e.h ->> 'name' = ''
                     ELSE true END
                THEN '"name" must be the handler''s name, a non-empty string'
            WHEN CASE jsonb_typeof(e.h -> 'lease_seconds')
                     WHEN 'number' THEN NOT ((e.h -> 'lease_seconds')::numeric > 0
                                             AND (e.h -> 'lease_seconds')::numeric <= 3153600000)
                     ELSE true END
                THEN '"lease_seconds" must be the lease a claimed job gets, in seconds '
                     '(a number above 0, at most 100 years)'
            WHEN CASE jsonb_typeof(e.h -> 'free')
                     WHEN 'number' THEN NOT ((e.h -> 'free')::numeric
                                             BETWEEN 0 AND int4_max
                                             AND (e.h -> 'free')::numeric
                                                 = trunc((e.h -> 'free')::numeric))
                     ELSE true END
                THEN '"free" must be how many more jobs it may take now (a whole number, '
                     '0 to 2147483647)'
            WHEN CASE coalesce(jsonb_typeof(e.h -> 'max_attempts'), 'null')
                     WHEN 'null' THEN false
                     WHEN 'number' THEN NOT ((e.h -> 'max_attempts')::numeric
                                             BETWEEN 1 AND int4_max
                                             AND (e.h -> 'max_attempts')::numeric
                                                 = trunc((e.h -> 'max_attempts')::numeric))
                     ELSE true END
                THEN '"max_attempts" must be null (the job''s own) or a whole number, '
                     '1 to 2147483647'
            WHEN CASE coalesce(jsonb_typeof(e.h -> 'queues'), 'null')
                     WHEN 'null' THEN false
                     WHEN 'array' THEN jsonb_array_length(e.h -> 'queues') > 1000
                                       OR jsonb_path_exists(e.h -> 'queues',
                                                            'strict $[*] ? (@.type() != "string")')
                     ELSE true END
                THEN '"queues" must be null (all of queues) or an array of at most 1000 '
                     'queue names'
            WHEN CASE coalesce(jsonb_typeof(e.h -> 'max_running'), 'null')
                     WHEN 'null' THEN false
                     WHEN 'number' THEN NOT ((e.h -> 'max_running')::numeric
                                             BETWEEN 1 AND int4_max
                                             AND (e.h -> 'max_running')::numeric
                                                 = trunc((e.h -> 'max_running')::numeric))
                     ELSE true END
                THEN '"max_running" must be null (no limit) or a whole number, '
                     '1 to 2147483647'
            WHEN CASE coalesce(jsonb_typeof(e.h -> 'max_running_per_key'), 'null')
                     WHEN 'null' THEN false
                     WHEN 'number' THEN NOT ((e.h -> 'max_running_per_key')::numeric
                                             BETWEEN 1 AND int4_max
                                             AND (e.h -> 'max_running_per_key')::numeric
                                                 = trunc((e.h -> 'max_running_per_key')::numeric))
                     ELSE true END
                THEN '"max_running_per_key" must be null (no limit) or a whole number, '
                     '1 to 2147483647'
            -- fair share and start-rate limits (0033; claim_v4 checks the weights' values)
            WHEN coalesce(jsonb_typeof(e.h -> 'fair'), 'null') NOT IN ('null', 'boolean')
                THEN '"fair" must be null or true or false'
            WHEN coalesce(jsonb_typeof(e.h -> 'weights'), 'null') NOT IN ('null', 'object')
                THEN '"weights" must be null or an object of concurrency keys and jobs per '
                     'turn (whole numbers, 1 to 1000)'
            WHEN CASE coalesce(jsonb_typeof(e.h -> 'rate'), 'null')
                     WHEN 'null' THEN false
                     WHEN 'number' THEN NOT ((e.h -> 'rate')::numeric > 0
                                             AND (e.h -> 'rate')::numeric <= 1000000)
                     ELSE true END
                THEN '"rate" must be null (no limit) or starts per second, above 0 and at '
                     'most 1000000'
            WHEN CASE coalesce(jsonb_typeof(e.h -> 'rate_per_key'), 'null')
                     WHEN 'null' THEN false
                     WHEN 'number' THEN NOT ((e.h -> 'rate_per_key')::numeric > 0
                                             AND (e.h -> 'rate_per_key')::numeric <= 1000000)
                     ELSE true END
                THEN '"rate_per_key" must be null (no limit) or starts per second, above 0 '
                     'and at most 1000000'
            END AS problem) p
         WHERE p.problem IS NOT NULL
         ORDER BY e.n
         LIMIT 1;
    END IF;
    IF problem IS NULL THEN
        -- (a key given as JSON null is as one left out, as the checks above say: a cast
        -- of JSON null fails, hence nullif; 0041)
        SELECT array_agg(e.h ->> 'name' ORDER BY e.n),
               array_agg((e.h -> 'lease_seconds')::float8 ORDER BY e.n),
               array_agg((e.h -> 'free')::integer ORDER BY e.n),
               array_agg(nullif(e.h -> 'max_attempts', 'null')::integer ORDER BY e.n),
               jsonb_agg(coalesce(e.h -> 'queues', 'null') ORDER BY e.n),
               array_agg(nullif(e.h -> 'max_running', 'null')::integer ORDER BY e.n),
               array_agg(nullif(e.h -> 'max_running_per_key', 'null')::integer ORDER BY e.n),
               -- NULL when no handler has one: claim_v3's cost for a claim without them
               CASE WHEN bool_or(nullif(e.h -> 'fair', 'null')::boolean) THEN
                   array_agg(nullif(e.h -> 'fair', 'null')::boolean ORDER BY e.n) END,
               CASE WHEN bool_or(nullif(e.h -> 'fair', 'null')::boolean) THEN
                   jsonb_agg(coalesce(e.h -> 'weights', 'null') ORDER BY e.n) END,
               CASE WHEN bool_or(jsonb_typeof(e.h -> 'rate') = 'number') THEN
                   array_agg(nullif(e.h -> 'rate', 'null')::float8 ORDER BY e.n) END,
               CASE WHEN bool_or(jsonb_typeof(e.h -> 'rate_per_key') = 'number') THEN
                   array_agg(nullif(e.h -> 'rate_per_key', 'null')::float8 ORDER BY e.n) END
          INTO names, leases, free, attempts_over, their_queues, running, per_key,
               fair, weights, rate, rate_per_key
          FROM jsonb_array_elements(claim_jobs_v3.handlers) WITH ORDINALITY AS e(h, n);
        IF cardinality(names) <> (SELECT count(DISTINCT h) FROM unnest(names) h) THEN
            problem := 'handlers must name each handler once, not '
                       || left(array_to_string(names, ', '), 200);
        END IF;
    END IF;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgworkerd: claim_jobs_v3: %', problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF names IS NULL THEN
        RETURN;  -- no handler: nothing to claim for
    END IF;
    -- A durable commit (see the 0019 header: SET LOCAL here, never a SET clause).
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    -- Expired jobs end before the claim can see them, as claim_jobs_v2 ends them.
    PERFORM @schema@.job_expired_cancel(1000);
    SELECT array_agg(c.id), array_agg(c.rescued) INTO claimed_ids, claimed_rescued
      FROM @schema@.claim_v4(claim_jobs_v3.worker, claim_jobs_v3.queues, names, leases, free,
                             claim_jobs_v3.max_jobs, attempts_over, their_queues, running,
                             per_key, fair, weights, rate, rate_per_key) AS c;
    IF claimed_ids IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT j.id, j.queue, j.handler, j.payload, j.priority, j.attempts, j.max_attempts,
           j.lease_token, j.checkpoint, j.run_at, j.created_at, j.locked_until, c.rescued,
           j.timeout_seconds,
           -- {"<parent id>": its result (null unless it completed, or if pruned)}
           CASE WHEN j.parents_unfinished IS NOT NULL THEN (
               SELECT jsonb_object_agg(p.parent_id::text, pj.result)
                 FROM @schema@.job_parents p
                 LEFT JOIN @schema@.jobs pj ON pj.id = p.parent_id
                WHERE p.child_id = j.id) END,
           j.has_children,
           j.wait_for, j.wait_ended, s.payload, s.sent_at,
           CASE WHEN b.id IS NOT NULL THEN jsonb_build_object(
               'id', b.id, 'members', b.members, 'completed', b.completed, 'dead', b.dead,
               'cancelled', b.cancelled,
               'outcomes', coalesce((
                   SELECT jsonb_agg(jsonb_build_object('id', m.id, 'status', m.status,
                                                       'result', m.result,
                                                       'error', m.last_error) ORDER BY m.id)
                     FROM (SELECT m.id, m.status, m.result, m.last_error
                             FROM @schema@.jobs m
                            WHERE m.batch_id = b.id
                            ORDER BY m.id
                            LIMIT 100) m), '[]'::jsonb),
               'outcomes_complete', b.members <= 100) END,
           j.trace_context
      FROM unnest(claimed_ids, claimed_rescued) AS c(id, rescued)
      JOIN @schema@.jobs j ON j.id = c.id
      LEFT JOIN @schema@.signals s ON s.job_id = j.id AND s.name = j.wait_for
                                  AND j.wait_ended = 'signal'
      LEFT JOIN @schema@.batches b ON b.callback_id = j.id
     ORDER BY j.priority, j.run_at, j.id;
END;
$$;

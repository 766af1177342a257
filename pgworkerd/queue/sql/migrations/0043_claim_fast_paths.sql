-- claim_jobs_v3 cheaper for the claims daemons make (issue 26, item 5: an idle job's
-- start was 1 ms behind a703f83's, a claim's server time 0.56 ms of it). Measured on the
-- server (bench/claim_cost.py), three parts of each claim did work that most claims do
-- not need; each now runs only when it does:
--   * the checks of the handler objects: one jsonpath test first, the detailed checks
--     (which name the first bad value) only for handlers that fail it;
--   * the expired-job sweep (job_expired_cancel): only when an index probe finds an
--     expired job;
--   * claim_v4's fair and rate passes: claim_v3 when no handler is fair or rate-limited
--     (claim_v4 then behaves as claim_v3 does).
-- compatible-with-code-of-schema: 5
--
-- An expand migration: claim_jobs_v3 replaced (same signature, result and behaviour:
-- grants kept; its SET clauses as 0042 left them). The declaration is objects/claim.sql;
-- this is the same text.

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
-- (0042) its last statement reads the claimed rows through an array of ids: left to
-- plan_cache_mode = auto it was planned anew at every call, 0.45 ms of an idle claim's
-- 1.2 ms; the generic plan is the same join by primary key
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    -- The keys a handler object may have. A successor's keys join this list in the same
    -- CREATE OR REPLACE that reads them (absent: today's behaviour).
    known_keys CONSTANT text[] := '{name,lease_seconds,free,max_attempts,queues,max_running,'
                                  'max_running_per_key,fair,weights,rate,rate_per_key}';
    int4_max CONSTANT numeric := 2147483647;
    lease_max CONSTANT numeric := 3153600000;  -- seconds: 100 years
    rate_max CONSTANT numeric := 1000000;      -- starts per second
    queues_max CONSTANT integer := 1000;       -- queues per handler
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
    -- (0043) Handler objects as the daemon sends them pass one jsonpath test of every
    -- key, a tenth of a claim's time on an empty queue less than the checks below, which
    -- then run only for a claim that fails it, to find and name the first bad value. The
    -- test is at least as strict as they are, so it only saves time: the elements are
    -- objects (in strict mode: lax mode would look inside a nested array), and each
    -- value's .type() is tested before it is compared (lax mode unwraps an array in a
    -- comparison, never in .type()); `@.key == $known` holds if the key is one of them.
    IF problem IS NULL
       AND (jsonb_path_exists(claim_jobs_v3.handlers, 'strict $[*] ? (@.type() != "object")')
            OR jsonb_array_length(jsonb_path_query_array(claim_jobs_v3.handlers,
                   'lax $[*] ? (!exists(@.keyvalue() ? (!(@.key == $known)))
                       && @.name.type() == "string" && @.name != ""
                       && @.lease_seconds.type() == "number"
                       && @.lease_seconds > 0 && @.lease_seconds <= $lease_max
                       && @.free.type() == "number" && @.free >= 0
                       && @.free <= $int4_max && @.free == @.free.floor()
                       && (!exists(@.max_attempts) || @.max_attempts.type() == "null"
                           || (@.max_attempts.type() == "number" && @.max_attempts >= 1
                               && @.max_attempts <= $int4_max
                               && @.max_attempts == @.max_attempts.floor()))
                       && (!exists(@.queues) || @.queues.type() == "null"
                           || (@.queues.type() == "array" && @.queues.size() <= $queues_max
                               && !exists(@.queues[*].type() ? (@ != "string"))))
                       && (!exists(@.max_running) || @.max_running.type() == "null"
                           || (@.max_running.type() == "number" && @.max_running >= 1
                               && @.max_running <= $int4_max
                               && @.max_running == @.max_running.floor()))
                       && (!exists(@.max_running_per_key)
                           || @.max_running_per_key.type() == "null"
                           || (@.max_running_per_key.type() == "number"
                               && @.max_running_per_key >= 1
                               && @.max_running_per_key <= $int4_max
                               && @.max_running_per_key == @.max_running_per_key.floor()))
                       && (!exists(@.fair) || @.fair.type() == "null"
                           || @.fair.type() == "boolean")
                       && (!exists(@.weights) || @.weights.type() == "null"
                           || @.weights.type() == "object")
                       && (!exists(@.rate) || @.rate.type() == "null"
                           || (@.rate.type() == "number" && @.rate > 0
                               && @.rate <= $rate_max))
                       && (!exists(@.rate_per_key) || @.rate_per_key.type() == "null"
                           || (@.rate_per_key.type() == "number" && @.rate_per_key > 0
                               && @.rate_per_key <= $rate_max)))',
                   jsonb_build_object('known', known_keys, 'int4_max', int4_max,
                                      'lease_max', lease_max, 'rate_max', rate_max,
                                      'queues_max', queues_max)))
               <> jsonb_array_length(claim_jobs_v3.handlers)) THEN
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
                                             AND (e.h -> 'lease_seconds')::numeric <= lease_max)
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
                     WHEN 'array' THEN jsonb_array_length(e.h -> 'queues') > queues_max
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
                                             AND (e.h -> 'rate')::numeric <= rate_max)
                     ELSE true END
                THEN '"rate" must be null (no limit) or starts per second, above 0 and at '
                     'most 1000000'
            WHEN CASE coalesce(jsonb_typeof(e.h -> 'rate_per_key'), 'null')
                     WHEN 'null' THEN false
                     WHEN 'number' THEN NOT ((e.h -> 'rate_per_key')::numeric > 0
                                             AND (e.h -> 'rate_per_key')::numeric <= rate_max)
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
    -- Expired jobs end before the claim can see them, as claim_jobs_v2 ends them. (0043)
    -- The call only when some job has expired (the two conditions of job_expired_cancel's
    -- statements, each an index probe): most claims find none, and the call with its
    -- two UPDATEs was a sixth of a claim's time on an empty queue.
    IF EXISTS (SELECT FROM @schema@.jobs e
                WHERE e.status = 'pending' AND e.expires_at <= now())
       OR EXISTS (SELECT FROM @schema@.jobs e
                   WHERE e.status = 'running' AND e.locked_until < now()
                     AND e.expires_at <= now()) THEN
        PERFORM @schema@.job_expired_cancel(1000);
    END IF;
    -- (0043) claim_v3 when no handler is fair or rate-limited: claim_v4 then behaves as
    -- claim_v3 does (0033), at a quarter more of its cost (its fair and rate passes set
    -- up for nothing).
    IF fair IS NULL AND weights IS NULL AND rate IS NULL AND rate_per_key IS NULL THEN
        SELECT array_agg(c.id), array_agg(c.rescued) INTO claimed_ids, claimed_rescued
          FROM @schema@.claim_v3(claim_jobs_v3.worker, claim_jobs_v3.queues, names, leases,
                                 free, claim_jobs_v3.max_jobs, attempts_over, their_queues,
                                 running, per_key) AS c;
    ELSE
        SELECT array_agg(c.id), array_agg(c.rescued) INTO claimed_ids, claimed_rescued
          FROM @schema@.claim_v4(claim_jobs_v3.worker, claim_jobs_v3.queues, names, leases,
                                 free, claim_jobs_v3.max_jobs, attempts_over, their_queues,
                                 running, per_key, fair, weights, rate, rate_per_key) AS c;
    END IF;
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

-- claim_jobs_v3 (issue 24; docs/reference/sql-api.md): the daemon's claim from schema 31,
-- its per-handler settings as JSON objects, returning what woke each claimed job and a
-- batch callback's batch, which the daemon read with two more statements after each claim
-- until now (job_wakeups, batch_outcomes). claim_jobs_v2's comment says who still calls it.
-- compatible-with-code-of-schema: 5
--
-- An expand migration: it adds a function and changes a comment. Older daemons keep
-- claiming with claim_jobs_v2 (and claim_jobs), which stay as they are. The declaration is
-- objects/claim.sql; this is the same text.

COMMENT ON FUNCTION @schema@.claim_jobs_v2(text, text[], text[], float8[], integer[],
                                           integer, integer[], jsonb, integer[], integer[]) IS
    'claim_jobs, ending jobs past their expires_at first, with each job''s own timeout and '
    'its parents'' results (schema 27). Called by daemons of schemas 27 to 30 and by '
    'workers in other languages; new code calls claim_jobs_v3. docs/reference/sql-api.md.';

-- claim_jobs_v3 (0031, issue 24): claim_jobs_v2 with its per-handler settings as one JSON
-- array, and what a claimed job needs from other rows in its row, read by the claim:
--   * handlers: one JSON object per handler, {"name", "lease_seconds", "free",
--     "max_attempts", "queues", "max_running", "max_running_per_key"} (the arguments of
--     claim_jobs of those names; a key absent or null: none). Each is checked, and a bad
--     one raises 22023 saying which and why and claims nothing: not an array, more than
--     1,000 handlers or queues, an object with a key it does not know (a misspelt limit
--     must not pass for no limit), a name twice, a number of the wrong type, fractional,
--     negative or beyond its bound.
--   * wait_for, wait_ended, signal_payload, signal_sent_at: what ended the job's last
--     wait (WaitFor, 0028): the name it waited for, 'signal' or 'timeout', and the
--     signal's payload and time (NULL unless a signal ended it); all NULL for a job that
--     never waited. The daemon read them after each claim until 0031 (job_wakeups).
--   * batch: for a batch's callback (0030), the batch's counts and the outcomes of its
--     first 100 members by id, {"id", "members", "completed", "dead", "cancelled",
--     "outcomes": [{"id", "status", "result", "error"}, ...], "outcomes_complete"};
--     NULL for any other job. The daemon read it after each claim until 0031
--     (batch_outcomes).
-- Two statements after the claim, whatever it took (claim_jobs_v2 ran one per claimed
-- job): the claim's ids are collected, then one statement reads their rows with their
-- parents, signals and batches. A statement of its own, so that its snapshot sees the
-- claim (a join in the claim's statement would read rows as they were before it, and
-- miss a job enqueued meanwhile that the claim took); the rows are locked by the claim,
-- so nothing changed them in between.
-- A rolling upgrade: older daemons keep calling claim_jobs_v2, which stays (other
-- languages' workers may too). The implementation behind both is claim_v3.
--   SELECT * FROM pgworkerd.claim_jobs_v3('worker-1', '{default,mail}', 6,
--       '[{"name": "send_mail", "lease_seconds": 300, "free": 4},
--         {"name": "export", "lease_seconds": 60, "free": 2, "queues": ["default"],
--          "max_running": 10, "max_running_per_key": 2}]');
CREATE FUNCTION @schema@.claim_jobs_v3(
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
    batch jsonb
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
                                  'max_running_per_key}';
    int4_max CONSTANT numeric := 2147483647;
    problem text;
    names text[];
    leases float8[];
    free integer[];
    attempts_over integer[];
    their_queues jsonb;
    running integer[];
    per_key integer[];
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
            END AS problem) p
         WHERE p.problem IS NOT NULL
         ORDER BY e.n
         LIMIT 1;
    END IF;
    IF problem IS NULL THEN
        SELECT array_agg(e.h ->> 'name' ORDER BY e.n),
               array_agg((e.h -> 'lease_seconds')::float8 ORDER BY e.n),
               array_agg((e.h -> 'free')::integer ORDER BY e.n),
               array_agg((e.h -> 'max_attempts')::integer ORDER BY e.n),
               jsonb_agg(coalesce(e.h -> 'queues', 'null') ORDER BY e.n),
               array_agg((e.h -> 'max_running')::integer ORDER BY e.n),
               array_agg((e.h -> 'max_running_per_key')::integer ORDER BY e.n)
          INTO names, leases, free, attempts_over, their_queues, running, per_key
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
    -- Expired jobs end before the claim can see them (claim_jobs_v2's two statements).
    UPDATE @schema@.jobs j
       SET status = 'cancelled', finished_at = now(), updated_at = now(),
           last_error = 'expired: not started by its expires_at ' || j.expires_at
      FROM (SELECT e.id FROM @schema@.jobs e
             WHERE e.status = 'pending' AND e.expires_at <= now()
             ORDER BY e.expires_at
             LIMIT 1000
               FOR UPDATE SKIP LOCKED) AS expired
     WHERE j.id = expired.id;
    UPDATE @schema@.jobs j
       SET status = 'cancelled', finished_at = now(), updated_at = now(),
           locked_by = NULL, locked_until = NULL,
           last_error = 'expired: its lease ran out after its expires_at ' || j.expires_at
                        || '; not started again'
      FROM (SELECT e.id FROM @schema@.jobs e
             WHERE e.status = 'running' AND e.locked_until < now()
               AND e.expires_at <= now()
               FOR UPDATE SKIP LOCKED) AS expired
     WHERE j.id = expired.id;
    SELECT array_agg(c.id), array_agg(c.rescued) INTO claimed_ids, claimed_rescued
      FROM @schema@.claim_v3(claim_jobs_v3.worker, claim_jobs_v3.queues, names, leases, free,
                             claim_jobs_v3.max_jobs, attempts_over, their_queues, running,
                             per_key) AS c;
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
               'outcomes_complete', b.members <= 100) END
      FROM unnest(claimed_ids, claimed_rescued) AS c(id, rescued)
      JOIN @schema@.jobs j ON j.id = c.id
      LEFT JOIN @schema@.signals s ON s.job_id = j.id AND s.name = j.wait_for
                                  AND j.wait_ended = 'signal'
      LEFT JOIN @schema@.batches b ON b.callback_id = j.id
     ORDER BY j.priority, j.run_at, j.id;
END;
$$;

COMMENT ON FUNCTION @schema@.claim_jobs_v3(text, text[], integer, jsonb) IS
    'claim_jobs_v2 with its per-handler settings as JSON objects, returning what woke each '
    'job and a batch callback''s batch (schema 31): what the daemon calls. '
    'docs/reference/sql-api.md.';

REVOKE EXECUTE ON FUNCTION @schema@.claim_jobs_v3(text, text[], integer, jsonb) FROM PUBLIC;

-- A rolling upgrade (as 0022's and 0027's last blocks): who may call claim_jobs_v2 gets its
-- successor now, so that new daemons run before roles.sql is applied again.
DO $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT r.rolname
          FROM pg_catalog.pg_proc p
         CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
          JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
         WHERE p.oid = '@schema@.claim_jobs_v2(text, text[], text[], float8[], integer[], '
                       'integer, integer[], jsonb, integer[], integer[])'::regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
    LOOP
        EXECUTE pg_catalog.format(
            'GRANT EXECUTE ON FUNCTION @schema@.claim_jobs_v3(text, text[], integer, jsonb) TO %I',
            grantee);
    END LOOP;
END
$$;

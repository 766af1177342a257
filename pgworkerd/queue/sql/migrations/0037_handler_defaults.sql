-- Per-handler default dedupe policies (issue 25 item 3; docs/guide/enqueue.md "Dedupe").
-- compatible-with-code-of-schema: 5
--
-- An expand migration: a new table and function, and a new body (same signature) for
-- enqueue_many_v3, which reads the table on a dedupe hit of a job naming no policy. With
-- no row (until an operator sets one) every enqueue behaves as before, so older code keeps
-- enqueueing unchanged. The declaration is objects/handler_defaults.sql and enqueue.sql;
-- this is the same text.

-- One row per handler with a default dedupe policy. The enqueuer does not read the
-- daemons' config, so an operator writes the row (handler_default_set, which checks every
-- value: deploy/roles.sql lets pgworkerd_operator call it and pgworkerd_reader read the
-- table). enqueue_many_v3 (so enqueue_v4, the Python API and the CLI, which send every
-- job with a dedupe key through it) reads it for its dedupe hits only, and only for a job
-- that names no policy: a policy given with the enqueue wins, "existing" included. The
-- default decides what a hit does (reject, or move the pending holder's run time); the new
-- job's own run time is what its enqueue says (a debounce default does not delay the
-- first job of a key: give it a delay). The older enqueue functions (enqueue, enqueue_v2,
-- enqueue_many, enqueue_many_v2) keep their contract and return the holder's id.
CREATE TABLE @schema@.handler_defaults (
    handler              text PRIMARY KEY
        CONSTRAINT handler_defaults_handler_name CHECK (@schema@.enqueue_name_ok(handler)),
    dedupe_policy        text NOT NULL
        CONSTRAINT handler_defaults_dedupe_policy
        CHECK (dedupe_policy IN ('existing', 'reject', 'debounce')),
    debounce_seconds     double precision,
    debounce_max_seconds double precision,
    set_by               text NOT NULL DEFAULT session_user,
    set_at               timestamptz NOT NULL DEFAULT now(),
    -- debounce and debounce_max with "debounce" only, and then both, as per enqueue
    CONSTRAINT handler_defaults_debounce
        CHECK ((dedupe_policy = 'debounce') = (debounce_seconds IS NOT NULL)
               AND (debounce_seconds IS NULL) = (debounce_max_seconds IS NULL)
               AND debounce_seconds > 0
               AND debounce_max_seconds BETWEEN debounce_seconds AND 31536000)
);

-- Set a handler's default dedupe policy ("existing", "reject" or "debounce" with its
-- debounce and debounce_max, held to the enqueue's own bounds and messages:
-- job_extras_problem), or remove it (dedupe_policy NULL). A bad value raises 22023 naming
-- it and changes nothing. Returns whether a row is there afterwards.
CREATE FUNCTION @schema@.handler_default_set(
    handler text,
    dedupe_policy text,
    debounce interval DEFAULT NULL,
    debounce_max interval DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET intervalstyle = 'postgres'
AS $$
DECLARE
    job jsonb;
    problem text;
BEGIN
    IF handler_default_set.handler IS NULL
       OR NOT @schema@.enqueue_name_ok(handler_default_set.handler) THEN
        RAISE EXCEPTION 'pgworkerd: a handler name is 1 to 128 printable characters without '
                        'whitespace at either end, not %',
                        coalesce(quote_literal(left(handler_default_set.handler, 140)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF handler_default_set.dedupe_policy IS NULL THEN
        IF handler_default_set.debounce IS NOT NULL
           OR handler_default_set.debounce_max IS NOT NULL THEN
            RAISE EXCEPTION 'pgworkerd: handler %: debounce and debounce_max go with '
                            'dedupe_policy "debounce" (NULL removes the default)',
                            handler_default_set.handler
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        DELETE FROM @schema@.handler_defaults d WHERE d.handler = handler_default_set.handler;
        RETURN false;
    END IF;
    -- the enqueue's own checks, on the job object an enqueue with this policy would carry
    job := jsonb_strip_nulls(jsonb_build_object(
        'dedupe_key', 'k', 'dedupe_policy', handler_default_set.dedupe_policy,
        'debounce', handler_default_set.debounce::text,
        'debounce_max', handler_default_set.debounce_max::text));
    problem := @schema@.job_extras_problem(job, 1, jsonb_build_array(job));
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgworkerd: handler %: %', handler_default_set.handler, problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO @schema@.handler_defaults AS d
        (handler, dedupe_policy, debounce_seconds, debounce_max_seconds)
    VALUES (handler_default_set.handler, handler_default_set.dedupe_policy,
            @schema@.job_duration_seconds(job->'debounce'),
            @schema@.job_duration_seconds(job->'debounce_max'))
    ON CONFLICT ON CONSTRAINT handler_defaults_pkey DO UPDATE
        SET dedupe_policy = excluded.dedupe_policy,
            debounce_seconds = excluded.debounce_seconds,
            debounce_max_seconds = excluded.debounce_max_seconds,
            set_by = session_user, set_at = now();
    RETURN true;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.handler_default_set(text, text, interval, interval)
    FROM PUBLIC;

CREATE OR REPLACE FUNCTION @schema@.enqueue_many_v3(jobs jsonb)
RETURNS bigint[]
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET intervalstyle = 'postgres'
AS $$
DECLARE
    extras constant text[] :=
        '{after,after_index,on_parent_failure,expires_at,expire_in,timeout,'
        'dedupe_window,dedupe_policy,debounce,debounce_max,trace}';
    v2_keys constant text[] :=
        '{handler,payload,queue,priority,run_at,delay,max_attempts,dedupe_key,concurrency_key}';
    total integer;
    ids bigint[];
    queues text[];
    parent_ids bigint[];
    readable_ids bigint[];
    missing bigint;
    bad record;
    problem text;
    hits jsonb;
    hit record;
BEGIN
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' THEN
        RAISE EXCEPTION 'pgworkerd: enqueue_many expects a JSON array of job objects'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    total := jsonb_array_length(jobs);
    IF total = 0 THEN
        RETURN '{}';
    END IF;
    IF EXISTS (SELECT FROM @schema@.enqueue_bounds) THEN
        PERFORM @schema@.enqueue_bounds_check(jobs);
    END IF;
    -- the keys v3 adds, checked for the jobs that carry one (or an unknown key)
    FOR bad IN SELECT t.e, t.n FROM jsonb_array_elements(jobs) WITH ORDINALITY AS t(e, n)
                WHERE jsonb_typeof(t.e) = 'object'
                  AND (t.e ?| extras OR t.e - v2_keys - extras <> '{}')
                ORDER BY t.n LOOP
        problem := @schema@.job_extras_problem(bad.e, bad.n, jobs);
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'pgworkerd: job % of %: %', bad.n, total, problem
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;

    -- Parents named by id: each must be a job the caller may read (as job_get_v1), else
    -- it is unknown (never enqueued, pruned, or another login's: which of these is not
    -- said). Their rows are locked in id order (two enqueues naming the same parents
    -- never deadlock) and marked has_children; the mark is written even when it is
    -- already set, so that a finisher in REPEATABLE READ that did not see this child
    -- fails to serialise instead of missing it (a lock alone would not stop it).
    SELECT array_agg(DISTINCT p.id::numeric::bigint) INTO parent_ids
      FROM jsonb_array_elements(jobs) AS t(e),
           jsonb_array_elements_text(CASE WHEN jsonb_typeof(t.e) = 'object'
                                               AND jsonb_typeof(t.e->'after') = 'array'
                                          THEN t.e->'after' END) AS p(id);
    IF parent_ids IS NOT NULL THEN
        SELECT array_agg(l.id) INTO readable_ids
          FROM (SELECT j.id FROM @schema@.jobs j
                 WHERE j.id = ANY (parent_ids)
                   AND (j.enqueued_by = session_user
                        OR has_any_column_privilege(session_user, '@schema@.jobs', 'SELECT'))
                 ORDER BY j.id
                   FOR NO KEY UPDATE) AS l;
        SELECT p INTO missing FROM unnest(parent_ids) p
         WHERE p <> ALL (coalesce(readable_ids, '{}')) ORDER BY p LIMIT 1;
        IF missing IS NOT NULL THEN
            SELECT t.n INTO bad FROM jsonb_array_elements(jobs) WITH ORDINALITY AS t(e, n)
             WHERE jsonb_typeof(t.e->'after') = 'array' AND t.e->'after' @> to_jsonb(missing)
             ORDER BY t.n LIMIT 1;
            RAISE EXCEPTION 'pgworkerd: job % of %: after names job %, which does not exist '
                            '(never enqueued, or pruned) or is not readable by this login',
                            bad.n, total, missing
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        UPDATE @schema@.jobs j SET has_children = true WHERE j.id = ANY (parent_ids);
    END IF;

    -- a key whose finished holder's window has passed is free again (0034)
    -- (ordered by finish: through jobs_dedupe_held_idx, whatever the table's size)
    IF EXISTS (SELECT FROM @schema@.jobs h
                WHERE h.finished_at IS NOT NULL AND h.dedupe_window_seconds IS NOT NULL
                ORDER BY h.finished_at LIMIT 1) THEN
        PERFORM @schema@.job_dedupe_release(jobs);
    END IF;

    WITH raw AS MATERIALIZED (
        SELECT n, e, CASE WHEN jsonb_typeof(e) = 'object' THEN e - 'concurrency_key' - extras
                          ELSE e END AS rest,
               CASE WHEN jsonb_typeof(e->'after') = 'array' THEN e->'after' END AS after,
               CASE WHEN jsonb_typeof(e->'after_index') = 'array'
                    THEN e->'after_index' END AS after_index
        FROM jsonb_array_elements(jobs) WITH ORDINALITY AS t(e, n)
    ), referenced AS (
        -- the positions some later job of the call waits for (0-based)
        SELECT DISTINCT x::integer AS position
          FROM raw, jsonb_array_elements_text(raw.after_index) AS x
    ), counted AS MATERIALIZED (
        SELECT raw.*,
               coalesce(jsonb_array_length(after), 0)
                 + coalesce(jsonb_array_length(after_index), 0) > 0 AS has_parents,
               CASE WHEN after IS NULL THEN 0 ELSE
                   (SELECT count(*) FROM @schema@.jobs pj
                     WHERE pj.id IN (SELECT x::numeric::bigint
                                       FROM jsonb_array_elements_text(after) x)
                       AND pj.status NOT IN ('completed', 'dead', 'cancelled')) END
               + CASE WHEN after_index IS NULL THEN 0 ELSE
                   (SELECT count(DISTINCT x) FROM jsonb_array_elements_text(after_index) x)
                 END AS unfinished,
               CASE WHEN after IS NULL THEN 0 ELSE
                   (SELECT count(*) FROM @schema@.jobs pj
                     WHERE pj.id IN (SELECT x::numeric::bigint
                                       FROM jsonb_array_elements_text(after) x)
                       AND pj.status IN ('dead', 'cancelled')) END AS failed
          FROM raw
    ), input AS MATERIALIZED (
        SELECT n, after, after_index, nextval('@schema@.jobs_id_seq') AS new_id,
               coalesce(e->>'queue', 'default') AS queue,
               CASE WHEN @schema@.enqueue_valid(rest)
                         AND coalesce(jsonb_typeof(e->'concurrency_key'), 'null')
                             IN ('string', 'null')
                         AND @schema@.concurrency_key_problem(e->>'concurrency_key') IS NULL
               THEN e->>'handler'
               ELSE @schema@.enqueue_reject_v2(
                   CASE WHEN jsonb_typeof(e) = 'object' THEN e - extras ELSE e END, n, total)
               END AS handler,
               coalesce(e->'payload', '{}') AS payload,
               coalesce((e->>'priority')::numeric::integer, 0) AS priority,
               CASE WHEN e->>'dedupe_policy' = 'debounce'
                    THEN now() + make_interval(secs => @schema@.job_duration_seconds(e->'debounce'))
                    ELSE coalesce((e->>'run_at')::timestamptz,
                                  now() + coalesce((e->>'delay')::interval, interval '0'))
                    END AS run_at,
               coalesce((e->>'max_attempts')::numeric::integer, 5) AS max_attempts,
               e->>'dedupe_key' AS dedupe_key,
               e->>'concurrency_key' AS concurrency_key,
               @schema@.job_duration_seconds(e->'dedupe_window') AS dedupe_window_seconds,
               e->>'dedupe_policy' AS dedupe_policy,  -- NULL: the handler's default (0037)
               @schema@.job_duration_seconds(e->'debounce') AS debounce_seconds,
               @schema@.job_duration_seconds(e->'debounce_max') AS debounce_max_seconds,
               CASE WHEN NOT has_parents THEN 'pending'
                    WHEN unfinished = 0
                         AND (failed = 0 OR e->>'on_parent_failure' = 'run') THEN 'pending'
                    ELSE 'waiting' END::@schema@.job_status AS status,
               CASE WHEN has_parents THEN unfinished END AS parents_unfinished,
               CASE WHEN has_parents THEN failed END AS parents_failed,
               CASE WHEN has_parents THEN coalesce(e->>'on_parent_failure', 'cancel')
                    END AS on_parent_failure,
               (n - 1) IN (SELECT position FROM referenced) AS has_children,
               coalesce((e->>'expires_at')::timestamptz,
                        now() + (e->>'expire_in')::interval) AS expires_at,
               @schema@.job_timeout_seconds(e) AS timeout_seconds,
               CASE WHEN jsonb_typeof(e->'trace') = 'object' THEN e->'trace' END
                   AS trace_context
        FROM counted
    ), inserted AS (
        INSERT INTO @schema@.jobs AS j
            (id, queue, handler, payload, priority, run_at, max_attempts, dedupe_key,
             concurrency_key, status, parents_unfinished, parents_failed, on_parent_failure,
             has_children, expires_at, timeout_seconds, dedupe_window_seconds, trace_context)
        SELECT new_id, queue, handler, payload, priority, run_at, max_attempts, dedupe_key,
               concurrency_key, status, parents_unfinished, parents_failed,
               on_parent_failure, has_children, expires_at, timeout_seconds,
               dedupe_window_seconds, trace_context
        FROM input
        ORDER BY n
        ON CONFLICT (dedupe_key, handler)
            WHERE dedupe_key IS NOT NULL
              AND (status IN ('pending', 'waiting', 'suspended', 'running')
                   OR dedupe_window_seconds IS NOT NULL)
            DO NOTHING
        RETURNING j.id, j.handler, j.dedupe_key
    ), edges AS (
        -- the edges of the jobs inserted (a dedupe hit inserts no job, so no edge: 0034)
        INSERT INTO @schema@.job_parents (child_id, parent_id)
        SELECT c.new_id, x::numeric::bigint
          FROM input c JOIN inserted ci ON ci.id = c.new_id,
               jsonb_array_elements_text(c.after) AS x
        UNION
        SELECT c.new_id, p.new_id
          FROM input c JOIN inserted ci ON ci.id = c.new_id,
               jsonb_array_elements_text(c.after_index) AS x
          JOIN input p ON p.n = x::integer + 1
    ), resolved AS (
        SELECT input.n, input.queue, input.handler, ins.id IS NULL AS hit, input.dedupe_policy,
               input.debounce_seconds, input.debounce_max_seconds,
               coalesce(
                   ins.id,
                   (SELECT min(i2.id) FROM inserted i2
                     WHERE i2.handler = input.handler AND i2.dedupe_key = input.dedupe_key),
                   (SELECT ex.id FROM @schema@.jobs ex
                     WHERE ex.handler = input.handler AND ex.dedupe_key = input.dedupe_key
                       AND (ex.status IN ('pending', 'waiting', 'suspended', 'running')
                            OR ex.dedupe_window_seconds IS NOT NULL))) AS id
          FROM input LEFT JOIN inserted ins ON ins.id = input.new_id
    )
    SELECT array_agg(r.id ORDER BY r.n), array_agg(DISTINCT r.queue),
           -- the dedupe hits whose policy is not "existing" (0034), handled below: the
           -- job's own policy, else its handler's default (handler_defaults, 0037)
           jsonb_agg(CASE WHEN r.dedupe_policy IS NOT NULL
                          THEN jsonb_build_object('n', r.n, 'id', r.id,
                                                  'policy', r.dedupe_policy,
                                                  'debounce', r.debounce_seconds,
                                                  'debounce_max', r.debounce_max_seconds)
                          ELSE jsonb_build_object('n', r.n, 'id', r.id,
                                                  'policy', d.dedupe_policy,
                                                  'debounce', d.debounce_seconds,
                                                  'debounce_max', d.debounce_max_seconds)
                     END ORDER BY r.n)
               FILTER (WHERE r.hit
                         AND coalesce(r.dedupe_policy, d.dedupe_policy, 'existing')
                             <> 'existing')
      INTO ids, queues, hits
      FROM resolved r
      LEFT JOIN @schema@.handler_defaults d
        ON r.hit AND r.dedupe_policy IS NULL AND d.handler = r.handler;

    IF array_position(ids, NULL) IS NOT NULL THEN
        -- A holder that committed after the statement's snapshot (its insert of the same
        -- key made ours wait, then conflict): a new statement sees it under READ COMMITTED
        -- (0034; under REPEATABLE READ it stays unseen, and the caller retries).
        SELECT array_agg(coalesce(x.id, (
                   SELECT ex.id FROM @schema@.jobs ex
                    WHERE ex.handler = t.e->>'handler' AND ex.dedupe_key = t.e->>'dedupe_key'
                      AND (ex.status IN ('pending', 'waiting', 'suspended', 'running')
                           OR ex.dedupe_window_seconds IS NOT NULL)))
                   ORDER BY x.n)
          INTO ids
          FROM unnest(ids) WITH ORDINALITY AS x(id, n)
          JOIN jsonb_array_elements(jobs) WITH ORDINALITY AS t(e, n) ON t.n = x.n;
        SELECT jsonb_agg(h || jsonb_build_object('id', ids[(h->>'n')::integer])
                         ORDER BY (h->>'n')::integer)
          INTO hits
          FROM jsonb_array_elements(hits) AS h;
    END IF;
    IF array_position(ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'pgworkerd: a job with an equal dedupe key changed concurrently; retry'
            USING ERRCODE = 'serialization_failure';
    END IF;

    -- Dedupe policies (0034): "reject" refuses the call (SQLSTATE PGWD1, the holder's id
    -- in the message and, as JSON, in the detail: nothing is written); "debounce" moves the
    -- holder's run time to now + debounce if it is pending, never earlier than it was and
    -- never past its enqueue + debounce_max (a holder not pending, or another login's, is
    -- returned as it is).
    FOR hit IN SELECT h.n, h.id, h.policy, h.debounce, h.debounce_max
                 FROM jsonb_to_recordset(hits)
                      AS h(n bigint, id bigint, policy text, debounce float8, debounce_max float8)
                ORDER BY h.n LOOP
        IF hit.policy = 'reject' THEN
            RAISE EXCEPTION 'pgworkerd: job % of %: its dedupe key is held by job %',
                            hit.n, total, hit.id
                USING ERRCODE = 'PGWD1',
                      DETAIL = jsonb_build_object('job_id', hit.id)::text,
                      HINT = 'dedupe_policy "reject" refuses a key another job holds; '
                             '"existing" returns that job''s id instead.';
        END IF;
        UPDATE @schema@.jobs j
           SET run_at = greatest(j.run_at,
                                 least(now() + make_interval(secs => hit.debounce),
                                       j.created_at + make_interval(secs => hit.debounce_max)))
         WHERE j.id = hit.id AND j.status = 'pending'
           -- only a job the caller may read (as job_get_v1): an enqueuer postpones its own
           -- login's jobs, never another application's
           AND (j.enqueued_by = session_user
                OR has_any_column_privilege(session_user, '@schema@.jobs', 'SELECT'));
    END LOOP;

    -- A parent that had already ended dead or cancelled cancels a child whose policy says
    -- so, now: through an UPDATE, so that the child's own children in this call see it
    -- (jobs_children_resolved) and its waiters hear it (jobs_notify_finished).
    IF parent_ids IS NOT NULL THEN
        UPDATE @schema@.jobs c
           SET status = 'cancelled', finished_at = now(),
               last_error = 'cancelled: parent job '
                   || (SELECT min(pj.id) FROM @schema@.job_parents p
                         JOIN @schema@.jobs pj ON pj.id = p.parent_id
                        WHERE p.child_id = c.id AND pj.status IN ('dead', 'cancelled'))
                   || ' had ended dead or cancelled before it was enqueued'
         WHERE c.id = ANY (ids) AND c.status = 'waiting' AND c.parents_failed > 0
           AND c.on_parent_failure = 'cancel';
    END IF;

    PERFORM pg_notify(@schema_literal@ || '.jobs', q) FROM unnest(queues) AS q;
    RETURN ids;
END;
$$;

-- OpenTelemetry (issue 27 item 5; pgworkerd.tracing, docs/operations/tracing.md): the
-- enqueuer's W3C trace context in jobs.trace_context, set through enqueue_many_v3's new
-- job key "trace" (checked by job_trace_problem: 22023 naming the job), so that each
-- attempt's span links to the trace that enqueued the job.
-- compatible-with-code-of-schema: 5
--
-- An expand migration: a nullable column (no rewrite, no constraint to validate), a new
-- check function, and job_extras_problem and enqueue_many_v3 replaced with bodies that
-- keep their signatures and accept one more key; every job older code enqueues is
-- enqueued as before. The declaration is objects/jobs.sql and objects/enqueue.sql; this
-- is the same text.

ALTER TABLE @schema@.jobs ADD COLUMN trace_context jsonb;

-- Names in the body below bind now: in pg_catalog only, as a pinned search_path would.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- What is wrong with a job object's "trace" (0035: the W3C trace context of its
-- enqueuer, pgworkerd.tracing), NULL: nothing (or no trace). An object of "traceparent"
-- (version 00's form: 2-32-16-2 lowercase hex digits, not version ff, neither id all
-- zeros) and optionally "tracestate" (at most 512 printable ASCII characters), and no
-- other key: stored as given, handed to every attempt of the job.
-- (pgworkerd/bounds.py trace_problem says the same for Python.)
CREATE FUNCTION @schema@.job_trace_problem(trace jsonb)
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
BEGIN ATOMIC
    SELECT CASE
        WHEN trace IS NULL OR jsonb_typeof(trace) = 'null' THEN NULL
        WHEN jsonb_typeof(trace) <> 'object'
            THEN 'trace must be an object of "traceparent" and "tracestate", not '
                 || jsonb_typeof(trace)
        WHEN trace - '{traceparent,tracestate}'::text[] <> '{}'
            THEN 'trace has an unknown key "'
                 || left((SELECT k
                            FROM jsonb_object_keys(trace - '{traceparent,tracestate}'::text[]) k
                           ORDER BY k LIMIT 1), 100)
                 || '" (known: traceparent, tracestate)'
        WHEN jsonb_typeof(trace->'traceparent') IS DISTINCT FROM 'string'
             OR NOT (trace->>'traceparent') ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
             OR left(trace->>'traceparent', 2) = 'ff'
             OR substr(trace->>'traceparent', 4, 32) = repeat('0', 32)
             OR substr(trace->>'traceparent', 37, 16) = repeat('0', 16)
            THEN 'trace.traceparent must be a W3C traceparent (such as '
                 || '"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), not '
                 || coalesce(left((trace->'traceparent')::text, 100), 'none')
        WHEN trace ? 'tracestate'
             AND NOT (jsonb_typeof(trace->'tracestate') = 'string'
                      AND char_length(trace->>'tracestate') <= 512
                      AND (trace->>'tracestate') ~ '^[\x20-\x7e]*$')
            THEN 'trace.tracestate must be at most 512 printable ASCII characters, not '
                 || left((trace->'tracestate')::text, 100)
        END;
END;

CREATE OR REPLACE FUNCTION @schema@.job_extras_problem(e jsonb, n bigint, jobs jsonb)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
SET intervalstyle = 'postgres'
AS $$
DECLARE
    known_keys constant text[] :=
        '{handler,payload,queue,priority,run_at,delay,max_attempts,dedupe_key,concurrency_key,'
        'after,after_index,on_parent_failure,expires_at,expire_in,timeout,'
        'dedupe_window,dedupe_policy,debounce,debounce_max,trace}';
    max_parents constant integer := 1000;
    durations constant text[] := '{dedupe_window,debounce,debounce_max}';
    duration text;
    policy text;
    parents integer := 0;
    item jsonb;
    expires timestamptz;
    starts timestamptz;
    seconds float8;
BEGIN
    IF e - known_keys <> '{}' THEN
        RETURN 'unknown key "' || (SELECT k FROM jsonb_object_keys(e - known_keys) k LIMIT 1)
               || '" (known: ' || array_to_string(known_keys, ', ') || ')';
    END IF;
    IF @schema@.job_trace_problem(e->'trace') IS NOT NULL THEN  -- (0035)
        RETURN @schema@.job_trace_problem(e->'trace');
    END IF;
    IF e ? 'after' AND jsonb_typeof(e->'after') <> 'null' THEN
        IF jsonb_typeof(e->'after') <> 'array' THEN
            RETURN 'after must be an array of job ids, not ' || jsonb_typeof(e->'after');
        END IF;
        parents := jsonb_array_length(e->'after');
        IF parents > max_parents THEN
            RETURN 'a job may have at most ' || max_parents || ' parents, not ' || parents;
        END IF;
        FOR item IN SELECT x FROM jsonb_array_elements(e->'after') x LOOP
            IF (CASE WHEN jsonb_typeof(item) <> 'number' THEN true
                     ELSE item::text::numeric % 1 <> 0
                          OR item::text::numeric NOT BETWEEN 1 AND 9223372036854775807 END)
            THEN
                RETURN 'after must hold job ids (integers from 1), not '
                       || left(item::text, 100);
            END IF;
        END LOOP;
    END IF;
    IF e ? 'after_index' AND jsonb_typeof(e->'after_index') <> 'null' THEN
        IF jsonb_typeof(e->'after_index') <> 'array' THEN
            RETURN 'after_index must be an array of positions of earlier jobs, not '
                   || jsonb_typeof(e->'after_index');
        END IF;
        parents := parents + jsonb_array_length(e->'after_index');
        IF parents > max_parents THEN
            RETURN 'a job may have at most ' || max_parents || ' parents, not ' || parents;
        END IF;
        FOR item IN SELECT x FROM jsonb_array_elements(e->'after_index') x LOOP
            IF (CASE WHEN jsonb_typeof(item) <> 'number' THEN true
                     ELSE item::text::numeric % 1 <> 0 END) THEN
                RETURN 'after_index must hold 0-based positions of jobs in this call, not '
                       || left(item::text, 100);
            END IF;
            IF item::text::numeric NOT BETWEEN 0 AND n - 2 THEN
                RETURN 'after_index may name only jobs earlier in the call (positions 0 to '
                       || (n - 2) || ' for job ' || n || '), not ' || item::text
                       || ': a job cannot wait for itself or a later job';
            END IF;
            IF jobs->(item::text::integer) ? 'dedupe_key'
               AND jsonb_typeof(jobs->(item::text::integer)->'dedupe_key') <> 'null' THEN
                RETURN 'after_index names job ' || (item::text::integer + 1)
                       || ', which has a dedupe_key: a parent in the same call cannot have one';
            END IF;
        END LOOP;
    END IF;
    IF e ? 'on_parent_failure' AND jsonb_typeof(e->'on_parent_failure') <> 'null' THEN
        IF NOT (jsonb_typeof(e->'on_parent_failure') = 'string'
                AND e->>'on_parent_failure' IN ('cancel', 'run', 'hold')) THEN
            RETURN 'on_parent_failure must be "cancel", "run" or "hold", not '
                   || left((e->'on_parent_failure')::text, 100);
        END IF;
        IF parents = 0 THEN
            RETURN 'on_parent_failure needs parents (after or after_index)';
        END IF;
    END IF;
    -- (a job with parents may have a dedupe_key since 0034: a waiting job holds its key)
    IF jsonb_typeof(e->'expires_at') IS NOT NULL AND jsonb_typeof(e->'expires_at') <> 'null' THEN
        IF jsonb_typeof(e->'expire_in') IS NOT NULL AND jsonb_typeof(e->'expire_in') <> 'null' THEN
            RETURN 'give expires_at or expire_in, not both';
        END IF;
        IF jsonb_typeof(e->'expires_at') <> 'string'
           OR NOT @schema@.readable(e->>'expires_at', 'timestamptz') THEN
            RETURN 'expires_at must be a timestamp with a time zone (such as '
                   || '2030-01-01T09:00:00Z), not ' || left((e->'expires_at')::text, 100);
        END IF;
        expires := (e->>'expires_at')::timestamptz;
        IF NOT isfinite(expires) OR expires >= '9000-01-01 00:00+00'::timestamptz THEN
            RETURN 'expires_at must be before 9000-01-01 UTC, not ' || (e->>'expires_at');
        END IF;
        IF expires <= now() THEN
            RETURN 'expires_at is in the past (' || (e->>'expires_at')
                   || '): the job could never start';
        END IF;
    ELSIF jsonb_typeof(e->'expire_in') IS NOT NULL AND jsonb_typeof(e->'expire_in') <> 'null' THEN
        IF jsonb_typeof(e->'expire_in') NOT IN ('string', 'number')
           OR NOT @schema@.readable(e->>'expire_in', 'interval') THEN
            RETURN 'expire_in must be an interval (such as "1 hour") or seconds, not '
                   || left((e->'expire_in')::text, 100);
        END IF;
        IF NOT ((e->>'expire_in')::interval > interval '0'
                AND (e->>'expire_in')::interval <= interval '100 years'
                AND extract(year FROM (e->>'expire_in')::interval) BETWEEN 0 AND 100
                AND extract(day FROM (e->>'expire_in')::interval) BETWEEN 0 AND 36525) THEN
            RETURN 'expire_in must be above 0 and at most 100 years, not ' || (e->>'expire_in');
        END IF;
        expires := now() + (e->>'expire_in')::interval;
    END IF;
    IF expires IS NOT NULL THEN
        -- run_at and delay are checked by enqueue_valid; here only when they are readable
        starts := CASE
            WHEN jsonb_typeof(e->'run_at') = 'string'
                 AND @schema@.readable(e->>'run_at', 'timestamptz')
                THEN (e->>'run_at')::timestamptz
            WHEN jsonb_typeof(e->'delay') IN ('string', 'number')
                 AND @schema@.readable(e->>'delay', 'interval')
                 AND (e->>'delay')::interval BETWEEN '-4000 years' AND '8000 years'
                THEN now() + (e->>'delay')::interval END;
        IF starts >= expires THEN
            RETURN 'expires at ' || expires || ', not after its run_at ' || starts
                   || ': the job could never start';
        END IF;
    END IF;
    IF jsonb_typeof(e->'timeout') IS NOT NULL AND jsonb_typeof(e->'timeout') <> 'null' THEN
        IF jsonb_typeof(e->'timeout') = 'number' THEN
            seconds := (e->>'timeout')::float8;
        ELSIF jsonb_typeof(e->'timeout') = 'string'
              AND @schema@.readable(e->>'timeout', 'interval')
              AND (e->>'timeout')::interval BETWEEN '-1000 years' AND '1000 years' THEN
            seconds := extract(epoch FROM (e->>'timeout')::interval);
        ELSE
            RETURN 'timeout must be seconds or an interval (such as "2 hours"), not '
                   || left((e->'timeout')::text, 100);
        END IF;
        IF NOT (seconds > 0 AND seconds <= 31536000) THEN
            RETURN 'timeout must be above 0 and at most 365 days, not ' || (e->>'timeout');
        END IF;
    END IF;
    -- Dedupe windows and policies (0034)
    FOREACH duration IN ARRAY durations LOOP
        CONTINUE WHEN jsonb_typeof(e->duration) IS NULL OR jsonb_typeof(e->duration) = 'null';
        IF NOT (jsonb_typeof(e->duration) = 'number'
                OR (jsonb_typeof(e->duration) = 'string'
                    AND @schema@.readable(e->>duration, 'interval')
                    AND (e->>duration)::interval BETWEEN '-1000 years' AND '1000 years')) THEN
            RETURN duration || ' must be seconds or an interval (such as "10 minutes"), not '
                   || left((e->duration)::text, 100);
        END IF;
        seconds := @schema@.job_duration_seconds(e->duration);
        IF NOT (seconds > 0 AND seconds <= 31536000) THEN
            RETURN duration || ' must be above 0 and at most 365 days, not ' || (e->>duration);
        END IF;
    END LOOP;
    IF jsonb_typeof(e->'dedupe_policy') IS NOT NULL AND jsonb_typeof(e->'dedupe_policy') <> 'null'
    THEN
        IF NOT (jsonb_typeof(e->'dedupe_policy') = 'string'
                AND e->>'dedupe_policy' IN ('existing', 'reject', 'debounce')) THEN
            RETURN 'dedupe_policy must be "existing", "reject" or "debounce", not '
                   || left((e->'dedupe_policy')::text, 100);
        END IF;
        policy := e->>'dedupe_policy';
    END IF;
    IF jsonb_typeof(e->'dedupe_key') IS DISTINCT FROM 'string' THEN
        IF policy IS NOT NULL OR jsonb_typeof(e->'dedupe_window') <> 'null' THEN
            RETURN 'dedupe_window and dedupe_policy need a dedupe_key';
        END IF;
    END IF;
    IF policy IS DISTINCT FROM 'debounce' THEN
        IF jsonb_typeof(e->'debounce') <> 'null' OR jsonb_typeof(e->'debounce_max') <> 'null' THEN
            RETURN 'debounce and debounce_max go with dedupe_policy "debounce"';
        END IF;
    ELSE
        IF jsonb_typeof(e->'debounce') IS NULL OR jsonb_typeof(e->'debounce') = 'null' THEN
            RETURN 'dedupe_policy "debounce" needs debounce (how far each enqueue of the key '
                   'moves the pending job''s run time)';
        END IF;
        IF jsonb_typeof(e->'debounce_max') IS NULL OR jsonb_typeof(e->'debounce_max') = 'null'
        THEN
            RETURN 'dedupe_policy "debounce" needs debounce_max (how long after its enqueue '
                   'the job may be postponed at most): an uncapped debounce could postpone it '
                   'forever';
        END IF;
        IF @schema@.job_duration_seconds(e->'debounce_max')
           < @schema@.job_duration_seconds(e->'debounce') THEN
            RETURN 'debounce_max (' || (e->>'debounce_max') || ') must be at least debounce ('
                   || (e->>'debounce') || ')';
        END IF;
        IF coalesce(jsonb_typeof(e->'run_at'), 'null') <> 'null'
           OR coalesce(jsonb_typeof(e->'delay'), 'null') <> 'null' THEN
            RETURN 'dedupe_policy "debounce" sets the run time (now + debounce): give no '
                   'run_at or delay';
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

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
               coalesce(e->>'dedupe_policy', 'existing') AS dedupe_policy,
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
        SELECT input.n, input.queue, ins.id IS NULL AS hit, input.dedupe_policy,
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
           -- the dedupe hits whose policy is not "existing" (0034), handled below
           jsonb_agg(jsonb_build_object('n', r.n, 'id', r.id, 'policy', r.dedupe_policy,
                                        'debounce', r.debounce_seconds,
                                        'debounce_max', r.debounce_max_seconds)
                     ORDER BY r.n)
               FILTER (WHERE r.hit AND r.dedupe_policy <> 'existing')
      INTO ids, queues, hits
      FROM resolved r;

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

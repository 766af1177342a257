-- Dedupe windows and policies (issue 25 item 3; docs/guide/enqueue.md "Dedupe"), and
-- waiting and suspended jobs holding their dedupe key (issue 24's leftover).
-- compatible-with-code-of-schema: 5
--
-- An expand migration: a nullable column (no rewrite), the dedupe index rebuilt with a
-- wider predicate, two functions, and new bodies (same signatures) for the enqueue
-- functions, job_extras_problem and prune_finished_v2. Older code keeps enqueueing: its
-- ON CONFLICT (..., status IN ('pending', 'running')) implies the new index's predicate,
-- so it still infers it; a key held by a waiting or suspended job (which older code
-- would have duplicated, and whose wake-up then failed on the unique index) makes older
-- code's enqueue raise its "changed concurrently; retry" error instead. Only new code
-- sets dedupe windows. The declaration is objects/jobs.sql, enqueue.sql and
-- retention.sql; this is the same text.

ALTER TABLE @schema@.jobs ADD COLUMN dedupe_window_seconds double precision
    CONSTRAINT jobs_dedupe_window_seconds_bounded
    CHECK (dedupe_window_seconds > 0 AND dedupe_window_seconds <= 31536000);

-- Before the index takes waiting and suspended jobs in: a key that such a job shares with
-- a pending or running job of its handler (possible until now: the suspended job had left
-- the index) stays with the pending or running one, and of several waiting or suspended
-- jobs sharing one, with the oldest; the others lose their key (they would have failed on
-- the unique index when woken).
UPDATE @schema@.jobs d
   SET dedupe_key = NULL
 WHERE d.dedupe_key IS NOT NULL AND d.status IN ('waiting', 'suspended')
   AND EXISTS (SELECT 1 FROM @schema@.jobs o
                WHERE o.handler = d.handler AND o.dedupe_key = d.dedupe_key AND o.id <> d.id
                  AND (o.status IN ('pending', 'running')
                       OR (o.status IN ('waiting', 'suspended') AND o.id < d.id)));

DROP INDEX @schema@.jobs_dedupe_live_idx;

-- Dedupe: one job holds each key of a handler (0004: keys were global, so one client
-- could squat another application's key): a job that has not finished (pending, waiting,
-- suspended or running: 0034, before it only pending and running), or a finished one
-- whose dedupe window has not been released (dedupe_window_seconds). Every enqueue's
-- ON CONFLICT and every look-up of a key's holder spells this predicate out, so that the
-- planner infers this index (and ON CONFLICT clauses of older releases, which say
-- status IN ('pending', 'running'), still imply it).
CREATE UNIQUE INDEX jobs_dedupe_live_idx ON @schema@.jobs (dedupe_key, handler)
    WHERE dedupe_key IS NOT NULL
      AND (status IN ('pending', 'waiting', 'suspended', 'running')
           OR dedupe_window_seconds IS NOT NULL);

-- Finished jobs still holding their dedupe key (0034), by finish time: retention's sweep
-- releases those whose window has passed, oldest first, without reading other jobs.
CREATE INDEX jobs_dedupe_held_idx ON @schema@.jobs (finished_at)
    WHERE finished_at IS NOT NULL AND dedupe_window_seconds IS NOT NULL;

-- Functions (objects/enqueue.sql).

SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- Dedupe windows (0034): release the keys of `jobs` (enqueue_many's job objects: those
-- with a string handler and dedupe_key) that a finished job holds past its window, so
-- that the insert that follows may take them. The unique index keeps a finished holder's
-- key until it is released (here, by the single enqueue's retry, or by retention's sweep
-- in prune_finished_v2), so the window is exact at every enqueue whatever the sweep's
-- pace. A probe of jobs_dedupe_live_idx per key; nothing written when no window has
-- passed. The enqueue_many functions call it only while some finished job holds a key
-- (one probe of jobs_dedupe_held_idx, empty unless windows are used). PL/pgSQL: its plan
-- is kept for the session.
CREATE FUNCTION @schema@.job_dedupe_release(jobs jsonb)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE @schema@.jobs h SET dedupe_window_seconds = NULL
      FROM (SELECT DISTINCT t.e->>'handler' AS handler, t.e->>'dedupe_key' AS dedupe_key
              FROM jsonb_array_elements(jobs) AS t(e)
             WHERE jsonb_typeof(t.e) = 'object'
               AND jsonb_typeof(t.e->'handler') = 'string'
               AND jsonb_typeof(t.e->'dedupe_key') = 'string') k
     WHERE h.dedupe_key = k.dedupe_key AND h.handler = k.handler
       AND h.dedupe_window_seconds IS NOT NULL
       AND h.finished_at + make_interval(secs => h.dedupe_window_seconds) <= now();
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.job_dedupe_release(jsonb) FROM PUBLIC;

-- A duration of a job object (dedupe_window, debounce, debounce_max: 0034) in seconds: a
-- number of seconds or an interval's text (checked by job_extras_problem); NULL: none.
CREATE FUNCTION @schema@.job_duration_seconds(value jsonb)
RETURNS float8
LANGUAGE sql
STABLE
BEGIN ATOMIC
    SELECT CASE jsonb_typeof(value)
               WHEN 'number' THEN (value #>> '{}')::float8
               WHEN 'string' THEN extract(epoch FROM (value #>> '{}')::interval)::float8 END;
END;

-- The one definition of enqueue. Takes a JSON array of job objects:
--   {"handler": text, "payload": object, "queue": text, "priority": int,
--    "run_at": timestamptz | "delay": interval, "max_attempts": int, "dedupe_key": text}
-- and returns the job ids in input order. A dedupe key that matches the key's holder of the
-- same handler (a job not finished, or a finished one within its dedupe window: 0034)
-- returns that job's id instead of inserting (keys are scoped per handler: one
-- application cannot squat another's). Listeners are notified on commit, once
-- per queue.
--
-- Bounds (pgworkerd/bounds.py holds the same for Python; each refusal is SQLSTATE 22023
-- and writes nothing):
--   handler, queue: 1 to 128 characters, not blank, no leading or trailing whitespace,
--     no control characters (C0, DEL, C1, U+2028/2029, bidi controls U+202A-202E and
--     U+2066-2069), since they are printed by the CLI and the logs;
--   priority: -32768 to 32767; max_attempts: 1 to 1000;
--   run_at (or now() + delay): finite, from 1900-01-01 up to (not including) 9000-01-01
--     UTC, so that every client (psycopg: Python datetimes) can load it;
--   dedupe_key: NULL or 1 to 512 characters; no keys other than the ones above;
--   payload: at most 64 MiB (as jsonb) and nested at most 255 levels deep, so that a
--     child can be handed it (what the database cannot check cheaply, such as a number
--     beyond what Python can load, is refused at the claim: that job alone ends dead).
--
-- One pass over the array: every job is checked as it is inserted, by enqueue_valid, which
-- PostgreSQL inlines (0008; a bad job makes enqueue_reject raise, naming it, and nothing
-- is written); batches without dedupe keys skip ON CONFLICT and the look-up of existing
-- jobs.
CREATE OR REPLACE FUNCTION @schema@.enqueue_many(jobs jsonb)
RETURNS bigint[]
LANGUAGE plpgsql
-- Definer's rights: enqueuers need EXECUTE only, no rights on the table.
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    total integer;
    ids bigint[];
    queues text[];
BEGIN
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' THEN
        RAISE EXCEPTION 'pgworkerd: enqueue_many expects a JSON array of job objects'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    total := jsonb_array_length(jobs);
    IF total = 0 THEN
        RETURN '{}';
    END IF;
    -- what an operator allows this login (0023): one look-up when no bound is set
    IF EXISTS (SELECT FROM @schema@.enqueue_bounds) THEN
        PERFORM @schema@.enqueue_bounds_check(jobs);
    END IF;

    IF NOT jsonb_path_exists(jobs, '$[*] ? (exists(@.dedupe_key) && @.dedupe_key != null)')
    THEN
        -- No dedupe keys: a plain insert. Ids come from the sequence in row order, and the
        -- rows are inserted in input order, so sorted ids are in input order. (A key the
        -- path above does not see, such as [] or [null], is refused by enqueue_valid: not
        -- a string; a string key is always seen.)
        WITH inserted AS (
            INSERT INTO @schema@.jobs AS j
                (queue, handler, payload, priority, run_at, max_attempts)
            SELECT coalesce(e->>'queue', 'default'),
                   CASE WHEN @schema@.enqueue_valid(e)
                   THEN e->>'handler'
                   ELSE @schema@.enqueue_reject(e, n, total) END,
                   coalesce(e->'payload', '{}'),
                   coalesce((e->>'priority')::numeric::integer, 0),
                   coalesce((e->>'run_at')::timestamptz,
                            now() + coalesce((e->>'delay')::interval, interval '0')),
                   coalesce((e->>'max_attempts')::numeric::integer, 5)
            FROM jsonb_array_elements(jobs) WITH ORDINALITY AS t(e, n)
            ORDER BY n
            RETURNING j.id, j.queue
        )
        SELECT array_agg(id ORDER BY id), array_agg(DISTINCT queue)
          INTO ids, queues
          FROM inserted;
    ELSE
        -- a key whose finished holder's window has passed is free again (0034)
        -- (ordered by finish: through jobs_dedupe_held_idx, whatever the table's size)
        IF EXISTS (SELECT FROM @schema@.jobs h
                    WHERE h.finished_at IS NOT NULL AND h.dedupe_window_seconds IS NOT NULL
                    ORDER BY h.finished_at LIMIT 1) THEN
            PERFORM @schema@.job_dedupe_release(jobs);
        END IF;
        WITH input AS MATERIALIZED (
            SELECT n, nextval('@schema@.jobs_id_seq') AS new_id,
                   coalesce(e->>'queue', 'default') AS queue,
                   CASE WHEN @schema@.enqueue_valid(e)
                   THEN e->>'handler'
                   ELSE @schema@.enqueue_reject(e, n, total) END AS handler,
                   coalesce(e->'payload', '{}') AS payload,
                   coalesce((e->>'priority')::numeric::integer, 0) AS priority,
                   coalesce((e->>'run_at')::timestamptz,
                            now() + coalesce((e->>'delay')::interval, interval '0')) AS run_at,
                   coalesce((e->>'max_attempts')::numeric::integer, 5) AS max_attempts,
                   e->>'dedupe_key' AS dedupe_key
            FROM jsonb_array_elements(jobs) WITH ORDINALITY AS t(e, n)
        ), inserted AS (
            INSERT INTO @schema@.jobs AS j
                (id, queue, handler, payload, priority, run_at, max_attempts, dedupe_key)
            SELECT new_id, queue, handler, payload, priority, run_at, max_attempts, dedupe_key
            FROM input
            ORDER BY n
            ON CONFLICT (dedupe_key, handler)
                WHERE dedupe_key IS NOT NULL
                  AND (status IN ('pending', 'waiting', 'suspended', 'running')
                       OR dedupe_window_seconds IS NOT NULL)
                DO NOTHING
            RETURNING j.id, j.handler, j.dedupe_key
        )
        SELECT array_agg(coalesce(
                   ins.id,
                   -- an equal key of the same handler earlier in this same batch
                   (SELECT min(i2.id) FROM inserted i2
                     WHERE i2.handler = input.handler AND i2.dedupe_key = input.dedupe_key),
                   -- an equal live job that already existed
                   (SELECT ex.id FROM @schema@.jobs ex
                     WHERE ex.handler = input.handler AND ex.dedupe_key = input.dedupe_key
                       AND (ex.status IN ('pending', 'waiting', 'suspended', 'running')
                            OR ex.dedupe_window_seconds IS NOT NULL)))
               ORDER BY input.n),
               array_agg(DISTINCT input.queue)
          INTO ids, queues
          FROM input LEFT JOIN inserted ins ON ins.id = input.new_id;

        IF array_position(ids, NULL) IS NOT NULL THEN
            -- The live job we collided with committed after our snapshot or finished
            -- meanwhile.
            RAISE EXCEPTION 'pgworkerd: a job with an equal dedupe key changed concurrently; retry'
                USING ERRCODE = 'serialization_failure';
        END IF;
    END IF;

    PERFORM pg_notify(@schema_literal@ || '.jobs', q) FROM unnest(queues) AS q;
    RETURN ids;
END;
$$;

-- Enqueue one job; arguments and bounds as in enqueue_many. Returns its id. A lean
-- single-row path (one INSERT .. ON CONFLICT), with the same checks and messages as
-- enqueue_many: one test for the common case, enqueue_reject for the message.
CREATE OR REPLACE FUNCTION @schema@.enqueue(
    handler text,
    payload jsonb DEFAULT '{}',
    queue text DEFAULT 'default',
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    delay interval DEFAULT NULL,
    max_attempts integer DEFAULT 5,
    dedupe_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
-- Definer's rights: enqueuers need EXECUTE only, no rights on the table.
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    run_at_min constant timestamptz := '1900-01-01 00:00+00';
    run_at_max constant timestamptz := '9000-01-01 00:00+00';  -- excluded
    delay_min constant interval := '-4000 years';  -- see enqueue_valid
    delay_max constant interval := '8000 years';
    new_id bigint;
    lapsed boolean;
BEGIN
    -- Arguments are named like columns: unqualified names are columns (use_column above),
    -- the arguments are written enqueue.name.
    IF enqueue.payload IS NULL OR jsonb_typeof(enqueue.payload) <> 'object'
       -- its size as a value (|| detoasts it: a payload read from a table may be compressed)
       OR pg_column_size(enqueue.payload || '{}') > 64 * 1024 * 1024
       OR jsonb_path_exists(enqueue.payload, 'strict $.**{256 to last}')
       OR enqueue.handler IS NULL
       OR NOT @schema@.enqueue_name_ok(enqueue.handler)
       OR NOT (enqueue.queue IS NULL OR @schema@.enqueue_name_ok(enqueue.queue))
       OR enqueue.priority NOT BETWEEN -32768 AND 32767
       OR enqueue.max_attempts NOT BETWEEN 1 AND 1000
       OR (enqueue.run_at IS NOT NULL
           AND (enqueue.delay IS NOT NULL
                OR NOT (enqueue.run_at >= run_at_min AND enqueue.run_at < run_at_max)))
       OR NOT (enqueue.delay IS NULL
               OR (enqueue.delay BETWEEN delay_min AND delay_max
                   AND extract(year FROM enqueue.delay) BETWEEN -2000 AND 8000
                   AND extract(day FROM enqueue.delay) BETWEEN -730000 AND 2922000
                   AND now() + enqueue.delay >= run_at_min
                   AND now() + enqueue.delay < run_at_max))
       OR char_length(enqueue.dedupe_key) NOT BETWEEN 1 AND 512 THEN
        -- one test above for the common case, then the message
        IF enqueue.payload IS NULL OR jsonb_typeof(enqueue.payload) <> 'object' THEN
            RAISE EXCEPTION 'pgworkerd: payload must be a JSON object, not %',
                coalesce(jsonb_typeof(enqueue.payload), 'NULL')
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        PERFORM @schema@.enqueue_reject(
            jsonb_build_object('payload', enqueue.payload)  -- as it is: nulls and all
            || jsonb_strip_nulls(jsonb_build_object(
                'handler', enqueue.handler, 'queue', enqueue.queue,
                'priority', enqueue.priority, 'run_at', enqueue.run_at,
                'delay', enqueue.delay, 'max_attempts', enqueue.max_attempts,
                'dedupe_key', enqueue.dedupe_key)),
            1, 1);
    END IF;
    -- what an operator allows this login (0023): one look-up when no bound is set
    IF EXISTS (SELECT FROM @schema@.enqueue_bounds) THEN
        PERFORM @schema@.enqueue_bounds_check(jsonb_build_array(jsonb_build_object(
            'queue', coalesce(enqueue.queue, 'default'), 'priority', enqueue.priority,
            'dedupe_key', enqueue.dedupe_key)));
    END IF;
    IF enqueue.dedupe_key IS NULL THEN
        -- nothing to dedupe: a plain insert, no speculative insertion
        INSERT INTO @schema@.jobs AS j (queue, handler, payload, priority, run_at, max_attempts)
        VALUES (coalesce(enqueue.queue, 'default'), enqueue.handler, enqueue.payload,
                coalesce(enqueue.priority, 0),
                coalesce(enqueue.run_at, now() + coalesce(enqueue.delay, interval '0')),
                coalesce(enqueue.max_attempts, 5))
        RETURNING j.id INTO new_id;
    ELSE
        -- At most twice: a key held by a finished job whose dedupe window has passed
        -- (0034) is released, and the insert tried again. Only a conflict pays for it.
        FOR attempt IN 1..2 LOOP
            INSERT INTO @schema@.jobs AS j
                (queue, handler, payload, priority, run_at, max_attempts, dedupe_key)
            VALUES (coalesce(enqueue.queue, 'default'), enqueue.handler, enqueue.payload,
                    coalesce(enqueue.priority, 0),
                    coalesce(enqueue.run_at, now() + coalesce(enqueue.delay, interval '0')),
                    coalesce(enqueue.max_attempts, 5), enqueue.dedupe_key)
            ON CONFLICT (dedupe_key, handler)
                WHERE dedupe_key IS NOT NULL
                  AND (status IN ('pending', 'waiting', 'suspended', 'running')
                       OR dedupe_window_seconds IS NOT NULL)
                DO NOTHING
            RETURNING j.id INTO new_id;
            EXIT WHEN new_id IS NOT NULL;
            SELECT ex.id,
                   ex.finished_at + make_interval(secs => ex.dedupe_window_seconds) <= now()
              INTO new_id, lapsed
              FROM @schema@.jobs ex
             WHERE ex.handler = enqueue.handler AND ex.dedupe_key = enqueue.dedupe_key
               AND (ex.status IN ('pending', 'waiting', 'suspended', 'running')
                    OR ex.dedupe_window_seconds IS NOT NULL);
            EXIT WHEN lapsed IS NOT TRUE OR attempt = 2;
            UPDATE @schema@.jobs h SET dedupe_window_seconds = NULL
             WHERE h.id = new_id AND h.dedupe_window_seconds IS NOT NULL
               AND h.finished_at + make_interval(secs => h.dedupe_window_seconds) <= now();
            new_id := NULL;
        END LOOP;
        IF new_id IS NULL THEN
            RAISE EXCEPTION
                'pgworkerd: a job with an equal dedupe key changed concurrently; retry'
                USING ERRCODE = 'serialization_failure';
        END IF;
    END IF;
    PERFORM pg_notify(@schema_literal@ || '.jobs', coalesce(enqueue.queue, 'default'));
    RETURN new_id;
END;
$$;

-- enqueue_many with concurrency keys: the same bounds, messages and behaviour, and a job
-- object may carry "concurrency_key" (a name like a queue's, or null). The check of the
-- other fields is enqueue_valid's, given the object without the key: e - 'concurrency_key'
-- is computed once per job (the MATERIALIZED input), not once per field the check reads.
CREATE OR REPLACE FUNCTION @schema@.enqueue_many_v2(jobs jsonb)
RETURNS bigint[]
LANGUAGE plpgsql
-- Definer's rights: enqueuers need EXECUTE only, no rights on the table.
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    total integer;
    ids bigint[];
    queues text[];
BEGIN
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' THEN
        RAISE EXCEPTION 'pgworkerd: enqueue_many expects a JSON array of job objects'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    total := jsonb_array_length(jobs);
    IF total = 0 THEN
        RETURN '{}';
    END IF;
    -- what an operator allows this login (0023): one look-up when no bound is set
    IF EXISTS (SELECT FROM @schema@.enqueue_bounds) THEN
        PERFORM @schema@.enqueue_bounds_check(jobs);
    END IF;

    -- a key whose finished holder's window has passed is free again (0034)
    -- (ordered by finish: through jobs_dedupe_held_idx, whatever the table's size)
    IF EXISTS (SELECT FROM @schema@.jobs h
                WHERE h.finished_at IS NOT NULL AND h.dedupe_window_seconds IS NOT NULL
                ORDER BY h.finished_at LIMIT 1) THEN
        PERFORM @schema@.job_dedupe_release(jobs);
    END IF;
    -- One path for keys and no keys: the dedupe path of enqueue_many (its plain path
    -- is kept for enqueue_many, which the client still uses for jobs without a key).
    WITH raw AS MATERIALIZED (
        SELECT n, e, CASE WHEN jsonb_typeof(e) = 'object' THEN e - 'concurrency_key'
                          ELSE e END AS rest
        FROM jsonb_array_elements(jobs) WITH ORDINALITY AS t(e, n)
    ), input AS MATERIALIZED (
        SELECT n, nextval('@schema@.jobs_id_seq') AS new_id,
               coalesce(e->>'queue', 'default') AS queue,
               CASE WHEN @schema@.enqueue_valid(rest)
                         AND coalesce(jsonb_typeof(e->'concurrency_key'), 'null')
                             IN ('string', 'null')
                         AND @schema@.concurrency_key_problem(e->>'concurrency_key') IS NULL
               THEN e->>'handler'
               ELSE @schema@.enqueue_reject_v2(e, n, total) END AS handler,
               coalesce(e->'payload', '{}') AS payload,
               coalesce((e->>'priority')::numeric::integer, 0) AS priority,
               coalesce((e->>'run_at')::timestamptz,
                        now() + coalesce((e->>'delay')::interval, interval '0')) AS run_at,
               coalesce((e->>'max_attempts')::numeric::integer, 5) AS max_attempts,
               e->>'dedupe_key' AS dedupe_key,
               e->>'concurrency_key' AS concurrency_key
        FROM raw
    ), inserted AS (
        INSERT INTO @schema@.jobs AS j
            (id, queue, handler, payload, priority, run_at, max_attempts, dedupe_key,
             concurrency_key)
        SELECT new_id, queue, handler, payload, priority, run_at, max_attempts, dedupe_key,
               concurrency_key
        FROM input
        ORDER BY n
        ON CONFLICT (dedupe_key, handler)
            WHERE dedupe_key IS NOT NULL
              AND (status IN ('pending', 'waiting', 'suspended', 'running')
                   OR dedupe_window_seconds IS NOT NULL)
            DO NOTHING
        RETURNING j.id, j.handler, j.dedupe_key
    )
    SELECT array_agg(coalesce(
               ins.id,
               -- an equal key of the same handler earlier in this same batch
               (SELECT min(i2.id) FROM inserted i2
                 WHERE i2.handler = input.handler AND i2.dedupe_key = input.dedupe_key),
               -- an equal live job that already existed
               (SELECT ex.id FROM @schema@.jobs ex
                 WHERE ex.handler = input.handler AND ex.dedupe_key = input.dedupe_key
                   AND (ex.status IN ('pending', 'waiting', 'suspended', 'running')
                        OR ex.dedupe_window_seconds IS NOT NULL)))
           ORDER BY input.n),
           array_agg(DISTINCT input.queue)
      INTO ids, queues
      FROM input LEFT JOIN inserted ins ON ins.id = input.new_id;

    IF array_position(ids, NULL) IS NOT NULL THEN
        -- The live job we collided with committed after our snapshot or finished meanwhile.
        RAISE EXCEPTION 'pgworkerd: a job with an equal dedupe key changed concurrently; retry'
            USING ERRCODE = 'serialization_failure';
    END IF;

    PERFORM pg_notify(@schema_literal@ || '.jobs', q) FROM unnest(queues) AS q;
    RETURN ids;
END;
$$;

-- What is wrong with the keys enqueue_many_v3 adds to a job object (job `n` of `jobs`,
-- 1-based), or NULL when nothing is: an unknown key (listing every key v3 knows), then
--   after: an array of job ids (integers from 1), the parents named by id;
--   after_index: an array of 0-based positions of jobs EARLIER in the same call (a job
--     cannot wait for itself or a later one, so no call can make a cycle), none of them
--     a job with a dedupe_key (a dedupe hit would make the parent another, older job);
--   at most 1,000 parents in all (after and after_index together);
--   on_parent_failure: "cancel" (the default), "run" or "hold", only with parents;
--   (a dedupe_key with parents is allowed since 0034: a waiting job holds its key);
--   dedupe_window, debounce, debounce_max: seconds or an interval, above 0, at most 365
--     days; dedupe_policy "existing", "reject" or "debounce"; window and policy only with
--     a dedupe_key, debounce keys only with "debounce", which needs both (debounce_max at
--     least debounce) and takes no run_at or delay (0034);
--   expires_at (a timestamp, in the future, before 9000-01-01) or expire_in (an interval
--     or a number of seconds, above 0, at most 100 years), not both, and not before the
--     job's run_at (it could never start);
--   timeout: a number of seconds or an interval, above 0, at most 365 days.
-- Called only for the jobs that carry one of those keys (or an unknown one).
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
        'dedupe_window,dedupe_policy,debounce,debounce_max}';
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

-- enqueue_many_v2 with dependencies and deadlines: the same bounds, messages, dedupe and
-- notifications, and each job object may also carry
--   "after": [job ids]          parents named by id (jobs the caller may read: its own
--                               login's, or any with SELECT on jobs), at most 1,000;
--   "after_index": [positions]  parents earlier in the same call, 0-based;
--   "on_parent_failure": "cancel" | "run" | "hold"  (job_parents.sql says what each does);
--   "expires_at": timestamptz | "expire_in": interval or seconds  (not started after it);
--   "timeout": seconds or interval  (overrides the handler's timeout for this job);
-- and with a dedupe_key (0034, docs/guide/enqueue.md "Dedupe"):
--   "dedupe_window": seconds or interval  (the key stays held that long after the job
--                               finished, whatever its end; above 0, at most 365 days);
--   "dedupe_policy": "existing" | "reject" | "debounce"  (what an enqueue that finds the
--                               key held does: return the holder's id (the default), raise
--                               SQLSTATE PGWD1 naming it, or move the pending holder's run
--                               time to now + debounce, capped at its enqueue + debounce_max);
--   "debounce", "debounce_max": seconds or intervals, both required by "debounce" (which
--                               sets run_at: no run_at or delay with it).
-- A waiting or suspended job holds its key too (0034), so a job with parents may have one.
-- A job with a parent that has not finished is inserted 'waiting'; one whose parents all
-- completed already is pending at once; one with a parent already dead or cancelled
-- follows its policy at once (cancelled, pending, or held). Every refusal (unknown or
-- unreadable parent id, a pruned one, a later or own position, over 1,000 parents, a bad
-- deadline) is SQLSTATE 22023 naming the job, and nothing is written.
-- The parents' rows stay locked (FOR NO KEY UPDATE) until the caller's transaction ends,
-- so a parent cannot finish unseen between this check and the child's commit: keep a
-- transaction that enqueues children short.
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
        'dedupe_window,dedupe_policy,debounce,debounce_max}';
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
               @schema@.job_timeout_seconds(e) AS timeout_seconds
        FROM counted
    ), inserted AS (
        INSERT INTO @schema@.jobs AS j
            (id, queue, handler, payload, priority, run_at, max_attempts, dedupe_key,
             concurrency_key, status, parents_unfinished, parents_failed, on_parent_failure,
             has_children, expires_at, timeout_seconds, dedupe_window_seconds)
        SELECT new_id, queue, handler, payload, priority, run_at, max_attempts, dedupe_key,
               concurrency_key, status, parents_unfinished, parents_failed,
               on_parent_failure, has_children, expires_at, timeout_seconds,
               dedupe_window_seconds
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

-- objects/retention.sql

-- The fleet's retention, version 2: prune_finished_v1 (0014) plus old schedule runs and
-- the registry rows of daemons gone long ago, each bounded by p_batch rows per call
-- (1..10000 per table, so a call deletes at most 3 * p_batch rows, each table's rows
-- oldest first, FOR UPDATE SKIP LOCKED, in the caller's one short transaction).
-- Retentions in seconds; NULL keeps that kind forever.
--
-- Schedule runs (p_schedule_runs, by tick) keep, of each schedule, its latest run (the
-- point catch-up counts from: schedule_declare) and every run from the oldest of its
-- latest 100 runs that created a job still pending or running (schedule_fire's overlap
-- check finds the job in the way through that run; the same rule as `pgworkerd prune`).
-- Each schedule's runs through the primary key (schedule, tick): one probe for a
-- schedule with nothing old, no scan of the table.
-- Daemons (p_gone_daemons): rows of state 'gone' whose stop (or last heartbeat, when it
-- was marked gone by a peer) is older than the retention; a live daemon's row is never
-- touched, and a daemon that comes back after a long outage registers anew.
--
-- Returns deleted (finished jobs), schedule_runs_deleted, daemons_deleted (all NULL when
-- another caller holds the retention lock: it is pruning) and live_daemons.
CREATE OR REPLACE FUNCTION @schema@.prune_finished_v2(
    p_completed float8, p_cancelled float8, p_dead float8,
    p_schedule_runs float8, p_gone_daemons float8, p_batch integer,
    OUT deleted integer, OUT schedule_runs_deleted integer, OUT daemons_deleted integer,
    OUT live_daemons integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    floor_seconds float8;
    n integer;
    schedule_name text;
    runs_cutoff timestamptz;
    oldest timestamptz;
    keep_from timestamptz;
BEGIN
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 10000 THEN
        RAISE EXCEPTION 'prune_finished_v2: batch must be 1..10000, not %', p_batch
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- (NaN sorts above every number in PostgreSQL: the upper bound refuses it too)
    IF EXISTS (SELECT 1
                 FROM unnest(ARRAY[p_completed, p_cancelled, p_dead, p_schedule_runs,
                                   p_gone_daemons]) r
                WHERE r < 0 OR r > 100 * 365.25 * 86400) THEN
        RAISE EXCEPTION 'prune_finished_v2: a retention must be from 0 to 100 years in seconds'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The floor (0022): for a caller that may not delete jobs itself (the daemon role).
    IF NOT has_table_privilege(session_user, '@schema@.jobs', 'DELETE') THEN
        SELECT f.min_seconds INTO floor_seconds FROM @schema@.retention_floor f;
        IF EXISTS (SELECT 1 FROM unnest(ARRAY[p_completed, p_cancelled, p_dead]) r
                    WHERE r < floor_seconds) THEN
            RAISE EXCEPTION 'prune_finished_v2: a retention of finished jobs below % seconds '
                            '(the floor an operator set) is refused', floor_seconds
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Raise [retention] in the config, or have an operator lower the '
                             'floor: SELECT ' || @schema_literal@
                             || '.retention_floor_set(seconds).';
        END IF;
    END IF;
    SELECT count(*) INTO live_daemons FROM @schema@.workers WHERE state <> 'gone';
    IF NOT pg_try_advisory_xact_lock(
            hashtextextended('pgworkerd.retention:' || @schema_literal@, 0)) THEN
        RETURN;  -- the counts stay NULL: another daemon is pruning
    END IF;

    -- A parent stays while one of its children has not finished (schema 27): the child
    -- reads its parents' results at each claim, and show and explain name them.
    -- A batch's member stays while its batch's callback has not finished (schema 30):
    -- the callback reads the members' outcomes when it starts (batches.sql).
    -- A job stays while it holds its dedupe key (schema 34: its window has not passed).
    -- One statement per status, its status written out: only a literal lets the planner
    -- use that status's partial index (a parameter could be any status). The ids first
    -- (ARRAY), then the delete by primary key: never a join that reads the whole table.
    deleted := 0;
    IF p_completed IS NOT NULL THEN
        DELETE FROM @schema@.jobs
         WHERE id = ANY (ARRAY(
                   SELECT id FROM @schema@.jobs
                    WHERE status = 'completed'
                      AND finished_at < now() - make_interval(secs => p_completed)
                      AND NOT (dedupe_window_seconds IS NOT NULL
                               AND finished_at + make_interval(secs => dedupe_window_seconds)
                                   > now())
                      AND NOT (has_children AND @schema@.job_children_unfinished(id))
                      AND NOT (batch_id IS NOT NULL
                               AND @schema@.batch_callback_unfinished(batch_id))
                    ORDER BY finished_at
                    LIMIT p_batch - deleted
                    FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS n = ROW_COUNT;
        deleted := deleted + n;
    END IF;
    IF p_cancelled IS NOT NULL AND deleted < p_batch THEN
        DELETE FROM @schema@.jobs
         WHERE id = ANY (ARRAY(
                   SELECT id FROM @schema@.jobs
                    WHERE status = 'cancelled'
                      AND finished_at < now() - make_interval(secs => p_cancelled)
                      AND NOT (dedupe_window_seconds IS NOT NULL
                               AND finished_at + make_interval(secs => dedupe_window_seconds)
                                   > now())
                      AND NOT (has_children AND @schema@.job_children_unfinished(id))
                      AND NOT (batch_id IS NOT NULL
                               AND @schema@.batch_callback_unfinished(batch_id))
                    ORDER BY finished_at
                    LIMIT p_batch - deleted
                    FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS n = ROW_COUNT;
        deleted := deleted + n;
    END IF;
    IF p_dead IS NOT NULL AND deleted < p_batch THEN
        DELETE FROM @schema@.jobs
         WHERE id = ANY (ARRAY(
                   SELECT id FROM @schema@.jobs
                    WHERE status = 'dead'
                      AND finished_at < now() - make_interval(secs => p_dead)
                      AND NOT (dedupe_window_seconds IS NOT NULL
                               AND finished_at + make_interval(secs => dedupe_window_seconds)
                                   > now())
                      AND NOT (has_children AND @schema@.job_children_unfinished(id))
                      AND NOT (batch_id IS NOT NULL
                               AND @schema@.batch_callback_unfinished(batch_id))
                    ORDER BY finished_at
                    LIMIT p_batch - deleted
                    FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS n = ROW_COUNT;
        deleted := deleted + n;
    END IF;

    -- Dedupe windows (0034): release, oldest first, up to p_batch keys that finished jobs
    -- hold past their windows (an enqueue of such a key releases it itself: this sweep
    -- only keeps the unique index to the keys actually held).
    UPDATE @schema@.jobs
       SET dedupe_window_seconds = NULL
     WHERE id = ANY (ARRAY(
               SELECT h.id FROM @schema@.jobs h
                WHERE h.finished_at IS NOT NULL AND h.dedupe_window_seconds IS NOT NULL
                  AND h.finished_at + make_interval(secs => h.dedupe_window_seconds) <= now()
                ORDER BY h.finished_at
                LIMIT p_batch
                FOR UPDATE SKIP LOCKED));

    schedule_runs_deleted := 0;
    IF p_schedule_runs IS NOT NULL THEN
        runs_cutoff := now() - make_interval(secs => p_schedule_runs);
        FOR schedule_name IN SELECT s.name FROM @schema@.schedules s ORDER BY s.name LOOP
            EXIT WHEN schedule_runs_deleted >= p_batch;
            SELECT min(r.tick) INTO oldest
              FROM @schema@.schedule_runs r WHERE r.schedule = schedule_name;
            CONTINUE WHEN oldest IS NULL OR oldest >= runs_cutoff;
            SELECT least(
                       runs_cutoff,
                       (SELECT max(r.tick) FROM @schema@.schedule_runs r
                         WHERE r.schedule = schedule_name),
                       (SELECT min(recent.tick)
                          FROM (SELECT r.job_id, r.tick FROM @schema@.schedule_runs r
                                 WHERE r.schedule = schedule_name AND r.job_id IS NOT NULL
                                 ORDER BY r.tick DESC LIMIT 100) recent
                          JOIN @schema@.jobs j ON j.id = recent.job_id
                         WHERE j.status IN ('pending', 'running')))
              INTO keep_from;
            DELETE FROM @schema@.schedule_runs r
             WHERE r.schedule = schedule_name
               AND r.tick = ANY (ARRAY(
                       SELECT o.tick FROM @schema@.schedule_runs o
                        WHERE o.schedule = schedule_name AND o.tick < keep_from
                        ORDER BY o.tick
                        LIMIT p_batch - schedule_runs_deleted
                        FOR UPDATE SKIP LOCKED));
            GET DIAGNOSTICS n = ROW_COUNT;
            schedule_runs_deleted := schedule_runs_deleted + n;
        END LOOP;
    END IF;

    daemons_deleted := 0;
    IF p_gone_daemons IS NOT NULL THEN
        DELETE FROM @schema@.workers
         WHERE id = ANY (ARRAY(
                   SELECT w.id FROM @schema@.workers w
                    WHERE w.state = 'gone'
                      AND coalesce(w.stopped_at, w.heartbeat_at)
                          < now() - make_interval(secs => p_gone_daemons)
                    ORDER BY coalesce(w.stopped_at, w.heartbeat_at)
                    LIMIT p_batch
                    FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS daemons_deleted = ROW_COUNT;
    END IF;
END;
$$;

-- objects/schedules.sql

-- Schedules an operator declared, fired by name and tick, the job built from the stored
-- definition (0022: handler, payload, queue, priority, max_attempts; 0034:
-- concurrency_key, dedupe_key, dedupe_window; the overlap policy too; schedule_declare is
-- the operator's), only at a tick the
-- stored schedule produces: a whole second, on its `every` (multiples of it since the
-- epoch) or its cron expression; at most 60 s ahead of the server's clock (a host's clock
-- may run ahead); and not older than the schedule fires (within 120 s of now: a tick's
-- grace of at most 60 s, and 60 s of clock skew), except the catch-up of catch_up =
-- "last": the latest tick missed, when it is later than every tick handled of the
-- schedule. Each tick once (schedule_runs' key, 0010). The worker must be a live daemon of
-- the registry. A refused tick raises 22023 with the reason and creates nothing.
CREATE OR REPLACE FUNCTION @schema@.schedule_fire_v2(
    name text, tick timestamptz, worker text, OUT outcome text, OUT job_id bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    stored @schema@.schedules;
    job jsonb;
    every float8;
    produced boolean;
    handled timestamptz;
BEGIN
    SELECT * INTO stored FROM @schema@.schedules s WHERE s.name = schedule_fire_v2.name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgworkerd: schedule % is not declared', quote_literal(name)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'An operator declares schedules: pgworkerd schedules declare.';
    END IF;
    IF tick IS NULL OR NOT isfinite(tick) THEN
        RAISE EXCEPTION 'pgworkerd: a tick must be a finite time, not %',
            coalesce(tick::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM @schema@.workers w
                    WHERE w.id = schedule_fire_v2.worker AND w.state <> 'gone'
                      AND w.heartbeat_at > now() - 2 * w.heartbeat_interval
                      AND w.heartbeat_at <= now() + interval '5 seconds') THEN
        RAISE EXCEPTION 'pgworkerd: schedule %: worker % is no live daemon of the registry',
            quote_literal(name), quote_literal(coalesce(worker, 'NULL'))
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A daemon fires schedules under the id it registered and heartbeats.';
    END IF;
    IF jsonb_typeof(stored.definition -> 'every') = 'number' THEN
        every := (stored.definition ->> 'every')::float8;
    END IF;
    produced := extract(microseconds FROM tick)::bigint % 1000000 = 0
        AND CASE WHEN every > 0
                 THEN extract(epoch FROM tick)::numeric % every::numeric = 0
                 WHEN coalesce(stored.definition ->> 'cron', '') <> ''
                 THEN @schema@.cron_matches(stored.definition ->> 'cron',
                                            coalesce(stored.definition ->> 'timezone', 'UTC'),
                                            tick)
                 ELSE false END;
    IF NOT produced THEN
        RAISE EXCEPTION 'pgworkerd: schedule %: % is no tick of it', quote_literal(name), tick
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF tick > now() + interval '60 seconds' THEN
        RAISE EXCEPTION 'pgworkerd: schedule %: tick % is in the future', quote_literal(name),
            tick
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A tick is fired when due; this host''s clock may run ahead.';
    END IF;
    IF tick < now() - interval '120 seconds' THEN
        SELECT max(r.tick) INTO handled
          FROM @schema@.schedule_runs r WHERE r.schedule = schedule_fire_v2.name;
        IF coalesce(stored.definition ->> 'catch_up', 'last') <> 'last'
           OR tick <= greatest(handled, stored.created_at) THEN
            RAISE EXCEPTION 'pgworkerd: schedule %: tick % is past (catch_up %, handled up '
                            'to %)', quote_literal(name), tick,
                coalesce(stored.definition ->> 'catch_up', 'last'),
                coalesce(greatest(handled, stored.created_at)::text, 'none')
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    SELECT jsonb_object_agg(e.key, e.value) INTO job
      FROM jsonb_each(jsonb_build_object(
               'handler', stored.definition -> 'handler',
               'payload', coalesce(stored.definition -> 'payload', '{}'::jsonb),
               'queue', stored.definition -> 'queue',
               'priority', stored.definition -> 'priority',
               'max_attempts', stored.definition -> 'max_attempts',
               -- the keys of the jobs it fires (0034)
               'concurrency_key', stored.definition -> 'concurrency_key',
               'dedupe_key', stored.definition -> 'dedupe_key',
               'dedupe_window', stored.definition -> 'dedupe_window')) e
     WHERE jsonb_typeof(e.value) <> 'null';
    SELECT f.outcome, f.job_id INTO outcome, job_id
      FROM @schema@.schedule_fire(name, tick, job,
                                  coalesce(stored.definition ->> 'overlap', 'skip'), worker) f;
END;
$$;

-- objects/compat.sql

-- schedule_fire (0010): fires a tick with the job object its caller passes.
-- Fire one tick of a schedule: in one transaction, record the tick and enqueue `job` (an
-- enqueue_many job object, checked by enqueue_many like any other), or record why no job
-- was created. Returns 'fired' and the job id, 'skipped' and the id of the job still in
-- the way (overlap), or 'taken' (another daemon handled this tick; nothing changed).
--
-- Fires of one schedule are serialized by locking its schedules row, so the overlap check
-- and the insert are one step. The overlap check looks at the jobs of the schedule's
-- latest 100 runs that created one:
--   skip:      none of them pending or running;
--   queue_one: none of them pending (one may be running);
--   allow:     no check.
-- Needed by: no release; daemons of schemas 10 to 21 (unreleased) call it. Current
-- daemons call schedule_fire_v2 (schedules.sql).
-- Dropped by: the first contract migration.
CREATE OR REPLACE FUNCTION @schema@.schedule_fire(
    name text, tick timestamptz, job jsonb, overlap text, worker text,
    OUT outcome text, OUT job_id bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    blocking bigint;
BEGIN
    IF overlap IS NULL OR overlap NOT IN ('skip', 'allow', 'queue_one') THEN
        RAISE EXCEPTION 'pgworkerd: overlap must be skip, allow or queue_one, not %',
            coalesce(quote_literal(overlap), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM 1 FROM @schema@.schedules s WHERE s.name = schedule_fire.name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgworkerd: schedule % is not declared', quote_literal(name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM @schema@.schedule_runs r
                WHERE r.schedule = schedule_fire.name AND r.tick = schedule_fire.tick) THEN
        outcome := 'taken';
        RETURN;
    END IF;
    IF overlap <> 'allow' THEN
        SELECT j.id INTO blocking
          FROM (SELECT r.job_id FROM @schema@.schedule_runs r
                 WHERE r.schedule = schedule_fire.name AND r.job_id IS NOT NULL
                 ORDER BY r.tick DESC LIMIT 100) recent
          JOIN @schema@.jobs j ON j.id = recent.job_id
         WHERE j.status = 'pending' OR (overlap = 'skip' AND j.status = 'running')
         ORDER BY j.id
         LIMIT 1;
    END IF;
    IF blocking IS NOT NULL THEN
        INSERT INTO @schema@.schedule_runs (schedule, tick, skipped, fired_by)
        VALUES (name, tick, 'overlap ' || overlap || ': job ' || blocking || ' is not finished',
                worker);
        outcome := 'skipped';
        job_id := blocking;
        RETURN;
    END IF;
    -- A dedupe key held (0034: by a job not finished, or one within its window): the
    -- tick is skipped, naming the holder (the key's lapsed window released first).
    IF jsonb_typeof(job -> 'dedupe_key') = 'string' THEN
        PERFORM @schema@.job_dedupe_release(jsonb_build_array(job));
        SELECT ex.id INTO blocking FROM @schema@.jobs ex
         WHERE ex.handler = job ->> 'handler' AND ex.dedupe_key = job ->> 'dedupe_key'
           AND (ex.status IN ('pending', 'waiting', 'suspended', 'running')
                OR ex.dedupe_window_seconds IS NOT NULL);
        IF blocking IS NOT NULL THEN
            INSERT INTO @schema@.schedule_runs (schedule, tick, skipped, fired_by)
            VALUES (name, tick, 'dedupe key ' || quote_literal(job ->> 'dedupe_key')
                                || ' is held by job ' || blocking, worker);
            outcome := 'skipped';
            job_id := blocking;
            RETURN;
        END IF;
    END IF;
    -- enqueue_many_v3 (0034; enqueue_many before): the same checks, and the job may carry
    -- a concurrency key and a dedupe window
    job_id := (@schema@.enqueue_many_v3(jsonb_build_array(job)))[1];
    INSERT INTO @schema@.schedule_runs (schedule, tick, job_id, fired_by)
    VALUES (name, tick, schedule_fire.job_id, worker);
    outcome := 'fired';
END;
$$;

-- objects/enqueue.sql: enqueue_v4

-- Enqueue one job with a dedupe window or policy (0034): enqueue_v3's arguments, then
-- dedupe_window, dedupe_policy ('existing', 'reject' or 'debounce'), debounce and
-- debounce_max; one job of enqueue_many_v3 (the same checks, messages and policies: a
-- rejected job raises SQLSTATE PGWD1 naming the holder).
CREATE FUNCTION @schema@.enqueue_v4(
    handler text,
    payload jsonb DEFAULT '{}',
    queue text DEFAULT 'default',
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    delay interval DEFAULT NULL,
    max_attempts integer DEFAULT 5,
    dedupe_key text DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    after bigint[] DEFAULT NULL,
    on_parent_failure text DEFAULT NULL,
    expires_at timestamptz DEFAULT NULL,
    expire_in interval DEFAULT NULL,
    timeout interval DEFAULT NULL,
    dedupe_window interval DEFAULT NULL,
    dedupe_policy text DEFAULT NULL,
    debounce interval DEFAULT NULL,
    debounce_max interval DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET intervalstyle = 'postgres'
AS $$
#variable_conflict use_column
BEGIN
    IF cardinality(enqueue_v4.after) > 1000 THEN
        -- refused before a JSON array of that size is built
        RAISE EXCEPTION 'pgworkerd: job 1 of 1: a job may have at most 1000 parents, not %',
            cardinality(enqueue_v4.after)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN (@schema@.enqueue_many_v3(jsonb_build_array(
        jsonb_build_object('payload', enqueue_v4.payload)
        || jsonb_strip_nulls(jsonb_build_object(
            'handler', enqueue_v4.handler, 'queue', enqueue_v4.queue,
            'priority', enqueue_v4.priority, 'run_at', enqueue_v4.run_at,
            'delay', enqueue_v4.delay::text, 'max_attempts', enqueue_v4.max_attempts,
            'dedupe_key', enqueue_v4.dedupe_key,
            'concurrency_key', enqueue_v4.concurrency_key,
            'after', to_jsonb(enqueue_v4.after),
            'on_parent_failure', enqueue_v4.on_parent_failure,
            'expires_at', enqueue_v4.expires_at,
            'expire_in', enqueue_v4.expire_in::text,
            'timeout', enqueue_v4.timeout::text,
            'dedupe_window', enqueue_v4.dedupe_window::text,
            'dedupe_policy', enqueue_v4.dedupe_policy,
            'debounce', enqueue_v4.debounce::text,
            'debounce_max', enqueue_v4.debounce_max::text)))))[1];
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.enqueue_v4(text, jsonb, text, integer, timestamptz, interval,
                                               integer, text, text, bigint[], text,
                                               timestamptz, interval, interval, interval,
                                               text, interval, interval) FROM PUBLIC;

-- 0008: enqueue's checks written once. A job object's validity was written out twice in
-- enqueue_many (its plain and its dedupe path) and the name check a third time in enqueue.
-- compatible-with-code-of-schema: 5
--
-- An expand migration (README "Upgrading"): enqueue_many and enqueue are replaced with
-- the same signatures and the same behaviour (every bound, message and SQLSTATE as in
-- 0004); only where their checks are written changes.
--
-- The helpers are SQL functions that PostgreSQL inlines into the calling statement, so
-- they cost nothing per job (measured: enqueue_many of 10,000 jobs took as long before as
-- after, README "Development"). Inlining needs a plain SQL function: no SET clause (so
-- no pinned search_path), not SECURITY DEFINER, STABLE rather than IMMUTABLE since the
-- checks read now() and readable(). The bodies are SQL-standard (BEGIN ATOMIC): parsed
-- once, here, with every name bound then, so the caller's search_path never reaches them,
-- which is what pinning gives the other functions.

-- Names in the helpers' bodies are bound now, so resolve them as the functions' pinned
-- search_path would: in pg_catalog only, never in a schema someone else could create in.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- Whether `name` may be a handler or queue name (the bounds of enqueue_many): not empty,
-- at most 128 characters, no control character (C0, DEL, C1, U+2028/2029, bidi controls),
-- no whitespace at either end. NULL for NULL.
CREATE FUNCTION @schema@.enqueue_name_ok(name text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
BEGIN ATOMIC
    SELECT char_length(name) <= 128
       -- [^ control or space] ( [^ control]* [^ control or space] )?
       AND name ~ ('^[^\x01-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069'
                   ' \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]'
                   '(?:[^\x01-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]*'
                   '[^\x01-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069'
                   ' \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000])?$');
END;

-- Whether a job object of enqueue_many passes every bound (see enqueue_many); the message
-- for one that does not comes from enqueue_reject. A dedupe_key is NULL, or a string of
-- 1 to 512 characters.
CREATE FUNCTION @schema@.enqueue_valid(e jsonb)
RETURNS boolean
LANGUAGE sql
STABLE
BEGIN ATOMIC
    SELECT jsonb_typeof(e) = 'object'
       -- no key but the known ones
       AND e - '{handler,payload,queue,priority,run_at,delay,max_attempts,dedupe_key}'::text[]
           = '{}'
       AND jsonb_typeof(e->'handler') = 'string'
       AND @schema@.enqueue_name_ok(e->>'handler')
       AND (jsonb_typeof(e->'payload') = 'object' OR NOT e ? 'payload')
       -- what no child could be handed: over 64 MiB, nested over 255 levels
       AND coalesce(pg_column_size(e->'payload') <= 64 * 1024 * 1024
                    AND NOT jsonb_path_exists(e->'payload', 'strict $.**{256 to last}'), true)
       AND (NOT e ? 'queue'
            OR (jsonb_typeof(e->'queue') = 'string' AND @schema@.enqueue_name_ok(e->>'queue')))
       AND CASE WHEN NOT e ? 'max_attempts' THEN true
                WHEN jsonb_typeof(e->'max_attempts') <> 'number' THEN false
                ELSE (e->>'max_attempts')::numeric BETWEEN 1 AND 1000
                 AND (e->>'max_attempts')::numeric % 1 = 0 END
       AND CASE WHEN NOT e ? 'priority' THEN true
                WHEN jsonb_typeof(e->'priority') <> 'number' THEN false
                ELSE (e->>'priority')::numeric BETWEEN -32768 AND 32767
                 AND (e->>'priority')::numeric % 1 = 0 END
       AND NOT (e ? 'run_at' AND e ? 'delay')
       -- text PostgreSQL cannot read is refused (22023), not a failed cast. Text that
       -- always reads (ISO 8601 with a day of the month up to 28, N seconds) is vouched
       -- for by a pattern, the rest by readable(), which costs more (an exception block).
       -- ([0-9], not \d: in an ICU database \d matches other scripts' digits too; no year
       -- 0000; UTC offsets up to 15:59, as PostgreSQL reads them.) run_at, or now() +
       -- delay, from 1900-01-01 up to (not including) 9000-01-01 UTC.
       AND CASE WHEN jsonb_typeof(e->'run_at') IS NULL
                     OR jsonb_typeof(e->'run_at') = 'null' THEN true
                WHEN NOT (jsonb_typeof(e->'run_at') = 'string'
                          AND (e->>'run_at'
                               ~ ('^(000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})'
                                  '-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])'
                                  '([T ]([01][0-9]|2[0-3]):[0-5][0-9]'
                                  '(:[0-5][0-9](\.[0-9]{1,6})?)?)?'
                                  '(Z|[+-](0[0-9]|1[0-5])(:?[0-5][0-9])?)?$')
                               OR @schema@.readable(e->>'run_at', 'timestamptz')))
                THEN false
                ELSE (e->>'run_at')::timestamptz >= '1900-01-01 00:00+00'::timestamptz
                 AND (e->>'run_at')::timestamptz < '9000-01-01 00:00+00'::timestamptz END
       -- The delay bounds are tested before now() + delay, which fails with another
       -- error ("timestamp out of range") before 4713 BC or after 294276 AD: wider than
       -- any delay the run_at range lets through, narrow enough that now() + delay always
       -- exists. An interval is added part by part (months, then days, then time), so its
       -- month and day parts are bounded too: '-7000 years 2555000 days' is near zero in
       -- all, but not on the way.
       AND CASE WHEN jsonb_typeof(e->'delay') IS NULL
                     OR jsonb_typeof(e->'delay') = 'null' THEN true
                WHEN NOT (jsonb_typeof(e->'delay') IN ('string', 'number')
                          AND (e->>'delay' ~ '^-?[0-9]{1,12}(\.[0-9]{1,9})?( seconds?)?$'
                               OR @schema@.readable(e->>'delay', 'interval')))
                THEN false
                ELSE (e->>'delay')::interval BETWEEN '-4000 years'::interval
                                                 AND '8000 years'::interval
                 AND extract(year FROM (e->>'delay')::interval) BETWEEN -2000 AND 8000
                 AND extract(day FROM (e->>'delay')::interval) BETWEEN -730000 AND 2922000
                 AND now() + (e->>'delay')::interval >= '1900-01-01 00:00+00'::timestamptz
                 AND now() + (e->>'delay')::interval < '9000-01-01 00:00+00'::timestamptz END
       AND (NOT e ? 'dedupe_key'
            OR jsonb_typeof(e->'dedupe_key') = 'null'
            OR (jsonb_typeof(e->'dedupe_key') = 'string'
                AND char_length(e->>'dedupe_key') BETWEEN 1 AND 512));
END;

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
                WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running')
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
                       AND ex.status IN ('pending', 'running')))
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
    IF enqueue.dedupe_key IS NULL THEN
        -- nothing to dedupe: a plain insert, no speculative insertion
        INSERT INTO @schema@.jobs AS j (queue, handler, payload, priority, run_at, max_attempts)
        VALUES (coalesce(enqueue.queue, 'default'), enqueue.handler, enqueue.payload,
                coalesce(enqueue.priority, 0),
                coalesce(enqueue.run_at, now() + coalesce(enqueue.delay, interval '0')),
                coalesce(enqueue.max_attempts, 5))
        RETURNING j.id INTO new_id;
    ELSE
        INSERT INTO @schema@.jobs AS j
            (queue, handler, payload, priority, run_at, max_attempts, dedupe_key)
        VALUES (coalesce(enqueue.queue, 'default'), enqueue.handler, enqueue.payload,
                coalesce(enqueue.priority, 0),
                coalesce(enqueue.run_at, now() + coalesce(enqueue.delay, interval '0')),
                coalesce(enqueue.max_attempts, 5), enqueue.dedupe_key)
        ON CONFLICT (dedupe_key, handler)
            WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running')
            DO NOTHING
        RETURNING j.id INTO new_id;
        IF new_id IS NULL THEN
            SELECT ex.id INTO new_id FROM @schema@.jobs ex
             WHERE ex.handler = enqueue.handler AND ex.dedupe_key = enqueue.dedupe_key
               AND ex.status IN ('pending', 'running');
            IF new_id IS NULL THEN
                RAISE EXCEPTION
                    'pgworkerd: a job with an equal dedupe key changed concurrently; retry'
                    USING ERRCODE = 'serialization_failure';
            END IF;
        END IF;
    END IF;
    PERFORM pg_notify(@schema_literal@ || '.jobs', coalesce(enqueue.queue, 'default'));
    RETURN new_id;
END;
$$;

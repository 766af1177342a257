-- Enqueueing: enqueue, enqueue_many and enqueue_reject (every job, and every caller of
-- release 0.2 on), their _v2 variants that also take a concurrency key (named _v2 before
-- the naming rule of docs/development/sql.md: a variant, not a successor), and the
-- checks they share, written once. The bounds an operator sets: enqueue_bounds.sql.
-- enqueue and enqueue_many also NOTIFY the `<schema>.jobs` channel that release 0.2's
-- daemons listen on (compat.sql says when that may go).

-- Whether PostgreSQL reads `value` as a timestamptz or an interval (`type`); NULL reads.
-- enqueue_many asks before it casts a run_at or delay, so that text it cannot read is
-- refused like any other bad value (22023, naming the job), not by a failed cast (22007).
-- Only text the common formats' patterns do not vouch for comes here: the exception block
-- costs a subtransaction (one that writes nothing, so it takes no transaction id).
CREATE FUNCTION @schema@.readable(value text, type text)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF type = 'timestamptz' THEN
        PERFORM value::timestamptz;
    ELSE
        PERFORM value::interval;
    END IF;
    RETURN true;
EXCEPTION WHEN data_exception THEN
    RETURN false;
END;
$$;

-- enqueue's checks (0008), written once: SQL functions PostgreSQL inlines into the calling
-- statement (so no SET search_path; their SQL-standard bodies bind every name here).

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

-- Why job `n` of `total` in an enqueue_many array (or enqueue's job, as 1 of 1) is invalid:
-- raises the error naming it. Only called for a job that failed the inline check, so valid
-- jobs never pay for it; declared to return text so that it fits in the insert's column list.
-- The messages are those of pgworkerd/jobs.py (JobSpec._checked) and pgworkerd/bounds.py.
CREATE FUNCTION @schema@.enqueue_reject(e jsonb, n bigint, total integer)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    known_keys constant text[] :=
        '{handler,payload,queue,priority,run_at,delay,max_attempts,dedupe_key}';
    -- refused anywhere in a name: C0, DEL, C1, line/paragraph separators, bidi controls
    control constant text := '[\x01-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]';
    -- refused at either end of a name (listed, so that no locale changes what matches)
    space constant text := '[ \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]';
    not_space constant text := '[^ \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]';
    run_at_range constant text := 'from 1900-01-01 up to (not including) 9000-01-01 UTC';
    run_at_min constant timestamptz := '1900-01-01 00:00+00';
    run_at_max constant timestamptz := '9000-01-01 00:00+00';
    delay_min constant interval := '-4000 years';  -- see enqueue_many
    delay_max constant interval := '8000 years';
    handler text := e->>'handler';
    queue text := e->>'queue';
BEGIN
    RAISE EXCEPTION 'pgworkerd: job % of %: %', n, total, CASE
        WHEN jsonb_typeof(e) <> 'object' THEN 'is not a JSON object'
        WHEN e - known_keys <> '{}'
            THEN 'unknown key "' || (SELECT k FROM jsonb_object_keys(e - known_keys) k LIMIT 1)
                 || '" (known: ' || array_to_string(known_keys, ', ') || ')'
        WHEN jsonb_typeof(e->'handler') IS DISTINCT FROM 'string' OR handler = ''
            THEN 'needs a non-empty "handler" string'
        WHEN char_length(handler) > 128
            THEN 'handler must be at most 128 characters, not ' || char_length(handler)
        WHEN handler ~ control
            THEN 'handler must not contain control characters (found U+'
                 || lpad(upper(to_hex(ascii(substring(handler FROM control)))), 4, '0') || ')'
        WHEN handler !~ not_space THEN 'handler must not be blank'
        WHEN handler ~ ('^' || space) OR handler ~ (space || '$')
            THEN 'handler must not begin or end with whitespace'
        WHEN e ? 'payload' AND jsonb_typeof(e->'payload') <> 'object'
            THEN 'payload must be a JSON object, not ' || jsonb_typeof(e->'payload')
        WHEN pg_column_size(e->'payload') > 64 * 1024 * 1024
            THEN 'payload must be at most 64 MiB, not ' || pg_column_size(e->'payload')
                 || ' bytes'
        WHEN jsonb_path_exists(e->'payload', 'strict $.**{256 to last}')
            THEN 'payload must be nested at most 255 levels deep'
        WHEN e ? 'queue' AND (jsonb_typeof(e->'queue') <> 'string' OR queue = '')
            THEN 'queue must be a non-empty string'
        WHEN char_length(queue) > 128
            THEN 'queue must be at most 128 characters, not ' || char_length(queue)
        WHEN queue ~ control
            THEN 'queue must not contain control characters (found U+'
                 || lpad(upper(to_hex(ascii(substring(queue FROM control)))), 4, '0') || ')'
        WHEN queue !~ not_space THEN 'queue must not be blank'
        WHEN queue ~ ('^' || space) OR queue ~ (space || '$')
            THEN 'queue must not begin or end with whitespace'
        WHEN e ? 'max_attempts' AND CASE WHEN jsonb_typeof(e->'max_attempts') <> 'number'
                                         THEN true
                                         ELSE (e->>'max_attempts')::numeric NOT BETWEEN 1 AND 1000
                                           OR (e->>'max_attempts')::numeric % 1 <> 0 END
            THEN 'max_attempts must be a positive integer up to 1000, not '
                 || (e->>'max_attempts')
        WHEN e ? 'priority' AND CASE WHEN jsonb_typeof(e->'priority') <> 'number'
                                     THEN true
                                     ELSE (e->>'priority')::numeric NOT BETWEEN -32768 AND 32767
                                       OR (e->>'priority')::numeric % 1 <> 0 END
            THEN 'priority must be an integer from -32768 to 32767, not ' || (e->>'priority')
        WHEN e ? 'run_at' AND e ? 'delay' THEN 'give run_at or delay, not both'
        WHEN jsonb_typeof(e->'run_at') NOT IN ('null', 'string')
             OR NOT @schema@.readable(e->>'run_at', 'timestamptz')
            THEN 'run_at must be a timestamp with a time zone (such as '
                 || '2030-01-01T09:00:00Z), not ' || left((e->'run_at')::text, 100)
        WHEN jsonb_typeof(e->'delay') NOT IN ('null', 'string', 'number')
             OR NOT @schema@.readable(e->>'delay', 'interval')
            THEN 'delay must be an interval (such as "90 seconds"), not '
                 || left((e->'delay')::text, 100)
        WHEN NOT ((e->>'run_at')::timestamptz >= run_at_min
                  AND (e->>'run_at')::timestamptz < run_at_max)
            THEN 'run_at must be ' || run_at_range || ', not ' || (e->>'run_at')
        WHEN NOT ((e->>'delay')::interval BETWEEN delay_min AND delay_max
                  AND extract(year FROM (e->>'delay')::interval) BETWEEN -2000 AND 8000
                  AND extract(day FROM (e->>'delay')::interval) BETWEEN -730000 AND 2922000
                  AND now() + (e->>'delay')::interval >= run_at_min
                  AND now() + (e->>'delay')::interval < run_at_max)
            THEN 'delay must keep run_at ' || run_at_range || ', not ' || (e->>'delay')
        WHEN e ? 'dedupe_key' AND jsonb_typeof(e->'dedupe_key') NOT IN ('string', 'null')
            THEN 'dedupe_key must be a string'
        WHEN char_length(e->>'dedupe_key') NOT BETWEEN 1 AND 512
            THEN 'dedupe_key must be 1 to 512 characters, not ' || char_length(e->>'dedupe_key')
        ELSE 'is invalid'
        END
        USING ERRCODE = 'invalid_parameter_value';
END;
$$;

-- The one definition of enqueue. Takes a JSON array of job objects:
--   {"handler": text, "payload": object, "queue": text, "priority": int,
--    "run_at": timestamptz | "delay": interval, "max_attempts": int, "dedupe_key": text}
-- and returns the job ids in input order. A dedupe key that matches a pending or running
-- job of the same handler returns that job's id instead of inserting (keys are scoped per
-- handler: one application cannot squat another's). Listeners are notified on commit, once
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
CREATE FUNCTION @schema@.enqueue_many(jobs jsonb)
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

-- Enqueue one job; arguments and bounds as in enqueue_many. Returns its id. A lean
-- single-row path (one INSERT .. ON CONFLICT), with the same checks and messages as
-- enqueue_many: one test for the common case, enqueue_reject for the message.
CREATE FUNCTION @schema@.enqueue(
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

-- Granted explicitly (see deploy/roles.sql), not to everyone.
REVOKE EXECUTE ON FUNCTION @schema@.enqueue_reject(jsonb, bigint, integer) FROM PUBLIC;

REVOKE EXECUTE ON FUNCTION @schema@.enqueue_many(jsonb) FROM PUBLIC;

REVOKE EXECUTE ON FUNCTION @schema@.enqueue(text, jsonb, text, integer, timestamptz, interval,
                                            integer, text) FROM PUBLIC;

-- Concurrency keys (0009).

-- Why `key` cannot be a concurrency key, or NULL when it can (NULL: no key). The bounds
-- and messages of a queue or handler name (enqueue_name_ok, enqueue_reject,
-- pgworkerd/bounds.py name_problem).
CREATE FUNCTION @schema@.concurrency_key_problem(key text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    control constant text := '[\x01-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]';
    space constant text := '[ \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]';
    not_space constant text := '[^ \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]';
BEGIN
    RETURN CASE
        WHEN key IS NULL OR @schema@.enqueue_name_ok(key) THEN NULL
        WHEN key = '' THEN 'concurrency_key must be a non-empty string'
        WHEN char_length(key) > 128
            THEN 'concurrency_key must be at most 128 characters, not ' || char_length(key)
        WHEN key ~ control
            THEN 'concurrency_key must not contain control characters (found U+'
                 || lpad(upper(to_hex(ascii(substring(key FROM control)))), 4, '0') || ')'
        WHEN key !~ not_space THEN 'concurrency_key must not be blank'
        WHEN key ~ ('^' || space) OR key ~ (space || '$')
            THEN 'concurrency_key must not begin or end with whitespace'
        ELSE 'concurrency_key is invalid' END;
END;
$$;

-- Why job `n` of `total` of enqueue_many_v2 is invalid: its concurrency_key, an unknown
-- key (listing the keys v2 knows), else whatever enqueue_reject says of the rest.
CREATE FUNCTION @schema@.enqueue_reject_v2(e jsonb, n bigint, total integer)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    known_keys constant text[] :=
        '{handler,payload,queue,priority,run_at,delay,max_attempts,dedupe_key,concurrency_key}';
    problem text;
BEGIN
    IF jsonb_typeof(e) = 'object' THEN
        IF e - known_keys <> '{}' THEN
            problem := 'unknown key "'
                       || (SELECT k FROM jsonb_object_keys(e - known_keys) k LIMIT 1)
                       || '" (known: ' || array_to_string(known_keys, ', ') || ')';
        ELSIF jsonb_typeof(e->'concurrency_key') NOT IN ('string', 'null') THEN
            problem := 'concurrency_key must be a string';
        ELSE
            problem := @schema@.concurrency_key_problem(e->>'concurrency_key');
        END IF;
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'pgworkerd: job % of %: %', n, total, problem
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        e := e - 'concurrency_key';
    END IF;
    RETURN @schema@.enqueue_reject(e, n, total);
END;
$$;

-- enqueue_many with concurrency keys: the same bounds, messages and behaviour, and a job
-- object may carry "concurrency_key" (a name like a queue's, or null). The check of the
-- other fields is enqueue_valid's, given the object without the key: e - 'concurrency_key'
-- is computed once per job (the MATERIALIZED input), not once per field the check reads.
CREATE FUNCTION @schema@.enqueue_many_v2(jobs jsonb)
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
        -- The live job we collided with committed after our snapshot or finished meanwhile.
        RAISE EXCEPTION 'pgworkerd: a job with an equal dedupe key changed concurrently; retry'
            USING ERRCODE = 'serialization_failure';
    END IF;

    PERFORM pg_notify(@schema_literal@ || '.jobs', q) FROM unnest(queues) AS q;
    RETURN ids;
END;
$$;

-- enqueue with a concurrency key. A new name, not an overload of enqueue: an overload
-- with one more defaulted argument would make every existing call that leaves it out
-- ambiguous ("function is not unique"). enqueue itself stays the faster path for jobs
-- without a key (one INSERT, no JSON); the client calls enqueue_v2 only with a key.
CREATE FUNCTION @schema@.enqueue_v2(
    handler text,
    payload jsonb DEFAULT '{}',
    queue text DEFAULT 'default',
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    delay interval DEFAULT NULL,
    max_attempts integer DEFAULT 5,
    dedupe_key text DEFAULT NULL,
    concurrency_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
-- Definer's rights: enqueuers need EXECUTE only, no rights on the table.
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- the delay goes through text: one style out and in, whatever the caller's
SET intervalstyle = 'postgres'
AS $$
#variable_conflict use_column
BEGIN
    -- One job of enqueue_many_v2: the same checks, messages ("job 1 of 1: ...") and
    -- insert. The payload goes in as it is (nulls and all), the rest without NULLs,
    -- which are the defaults.
    RETURN (@schema@.enqueue_many_v2(jsonb_build_array(
        jsonb_build_object('payload', enqueue_v2.payload)
        || jsonb_strip_nulls(jsonb_build_object(
            'handler', enqueue_v2.handler, 'queue', enqueue_v2.queue,
            'priority', enqueue_v2.priority, 'run_at', enqueue_v2.run_at,
            'delay', enqueue_v2.delay::text, 'max_attempts', enqueue_v2.max_attempts,
            'dedupe_key', enqueue_v2.dedupe_key,
            'concurrency_key', enqueue_v2.concurrency_key)))))[1];
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.enqueue_reject_v2(jsonb, bigint, integer) FROM PUBLIC;

REVOKE EXECUTE ON FUNCTION @schema@.enqueue_many_v2(jsonb) FROM PUBLIC;

REVOKE EXECUTE ON FUNCTION @schema@.enqueue_v2(text, jsonb, text, integer, timestamptz, interval,
                                               integer, text, text) FROM PUBLIC;

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

-- Dependencies and deadlines (0027, issue 24): enqueue_many_v3 and enqueue_v3.

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
CREATE FUNCTION @schema@.job_extras_problem(e jsonb, n bigint, jobs jsonb)
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

-- The timeout of a job object, in seconds (checked by job_extras_problem), NULL: none.
CREATE FUNCTION @schema@.job_timeout_seconds(e jsonb)
RETURNS float8
LANGUAGE sql
STABLE
BEGIN ATOMIC
    SELECT CASE jsonb_typeof(e->'timeout')
               WHEN 'number' THEN (e->>'timeout')::float8
               WHEN 'string' THEN extract(epoch FROM (e->>'timeout')::interval)::float8 END;
END;

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
--                               key held does, when not named: its handler's default in
--                               handler_defaults (0037), else "existing"): return the
--                               holder's id, raise
--                               SQLSTATE PGWD1 naming it, or move the pending holder's run
--                               time to now + debounce, capped at its enqueue + debounce_max);
--   "debounce", "debounce_max": seconds or intervals, both required by "debounce" (which
--                               sets run_at: no run_at or delay with it).
-- A waiting or suspended job holds its key too (0034), so a job with parents may have one.
--   "trace": {"traceparent", "tracestate"}  (0035: the enqueuer's W3C trace context,
--                               job_trace_problem; stored in jobs.trace_context).
-- A job with a parent that has not finished is inserted 'waiting'; one whose parents all
-- completed already is pending at once; one with a parent already dead or cancelled
-- follows its policy at once (cancelled, pending, or held). Every refusal (unknown or
-- unreadable parent id, a pruned one, a later or own position, over 1,000 parents, a bad
-- deadline) is SQLSTATE 22023 naming the job, and nothing is written.
-- The parents' rows stay locked (FOR NO KEY UPDATE) until the caller's transaction ends,
-- so a parent cannot finish unseen between this check and the child's commit: keep a
-- transaction that enqueues children short.
CREATE FUNCTION @schema@.enqueue_many_v3(jobs jsonb)
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

-- Enqueue one job with dependencies or deadlines: enqueue_v2's arguments, then after (job
-- ids), on_parent_failure, expires_at or expire_in, and timeout; one job of
-- enqueue_many_v3 (the same checks and messages, "job 1 of 1: ...").
CREATE FUNCTION @schema@.enqueue_v3(
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
    timeout interval DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET intervalstyle = 'postgres'
AS $$
#variable_conflict use_column
BEGIN
    IF cardinality(enqueue_v3.after) > 1000 THEN
        -- refused before a JSON array of that size is built
        RAISE EXCEPTION 'pgworkerd: job 1 of 1: a job may have at most 1000 parents, not %',
            cardinality(enqueue_v3.after)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN (@schema@.enqueue_many_v3(jsonb_build_array(
        jsonb_build_object('payload', enqueue_v3.payload)
        || jsonb_strip_nulls(jsonb_build_object(
            'handler', enqueue_v3.handler, 'queue', enqueue_v3.queue,
            'priority', enqueue_v3.priority, 'run_at', enqueue_v3.run_at,
            'delay', enqueue_v3.delay::text, 'max_attempts', enqueue_v3.max_attempts,
            'dedupe_key', enqueue_v3.dedupe_key,
            'concurrency_key', enqueue_v3.concurrency_key,
            'after', to_jsonb(enqueue_v3.after),
            'on_parent_failure', enqueue_v3.on_parent_failure,
            'expires_at', enqueue_v3.expires_at,
            'expire_in', enqueue_v3.expire_in::text,
            'timeout', enqueue_v3.timeout::text)))))[1];
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.enqueue_many_v3(jsonb) FROM PUBLIC;

REVOKE EXECUTE ON FUNCTION @schema@.enqueue_v3(text, jsonb, text, integer, timestamptz, interval,
                                               integer, text, text, bigint[], text,
                                               timestamptz, interval, interval) FROM PUBLIC;

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

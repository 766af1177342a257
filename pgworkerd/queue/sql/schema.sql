-- The declared schema: what the database looks like after every migration in
-- sql/migrations/ has been applied, written as one clean declaration.
--
-- Every new migration must update this file too: tests/test_migrate.py applies all the
-- migrations to one database and this file to another and requires their
-- `pg_dump --schema-only` to be equal (and the schema_version rows below to match).
--
-- @schema@ is replaced by the quoted schema name, @schema_literal@ by it as a string literal.

CREATE SCHEMA @schema@;

-- Created and filled by pgworkerd/migrate.py: one row per applied migration.
CREATE TABLE @schema@.schema_version (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    -- The oldest code (by the latest version it knows) that runs against the schema after
    -- this migration: see README "Upgrading". NULL means the version itself.
    compatible_with integer
);

-- The migrations this declaration includes, so that `pgworkerd migrate` after it is a no-op.
INSERT INTO @schema@.schema_version (version, name, compatible_with) VALUES
    (1, 'jobs', 1),
    (2, 'workers', 2),
    (3, 'claim', 3),
    (4, 'trust', 4),
    (5, 'finish', 5),
    (6, 'claim_v2', 5),
    (7, 'registry', 5),
    (8, 'enqueue_checks', 5),
    (9, 'limits', 5),
    (10, 'schedules', 5),
    (11, 'outcomes', 5),
    (12, 'attempts', 5),
    (13, 'wake', 5),
    (14, 'retention', 5),
    (15, 'job_logs', 5),
    (16, 'insight', 5),
    (17, 'handback', 5),
    (18, 'people_roles', 5),
    (19, 'worker_protocol', 5),
    (20, 'upkeep', 5),
    (21, 'silent', 5),
    (22, 'lockdown', 5),
    (23, 'enqueue_bounds', 5),
    (24, 'lease_fence', 5),
    (25, 'one_text', 5);

-- Jobs (0001).

CREATE TYPE @schema@.job_status AS ENUM ('pending', 'running', 'completed', 'dead', 'cancelled');

CREATE SEQUENCE @schema@.jobs_id_seq AS bigint;

CREATE TABLE @schema@.jobs (
    id               bigint PRIMARY KEY DEFAULT nextval('@schema@.jobs_id_seq'),
    queue            text NOT NULL DEFAULT 'default',
    handler          text NOT NULL,
    payload          jsonb NOT NULL DEFAULT '{}',
    status           @schema@.job_status NOT NULL DEFAULT 'pending',
    -- Lower runs sooner (like nice(1)): 0 is the default, negative is urgent.
    priority         integer NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    attempts         integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL DEFAULT 5,
    locked_by        text,
    locked_until     timestamptz,
    -- Fencing token: bumped by every claim; renew and finish statements must name it.
    lease_token      bigint NOT NULL DEFAULT 0,
    cancel_requested boolean NOT NULL DEFAULT false,
    last_error       text,
    result           jsonb,
    progress         jsonb,
    checkpoint       jsonb,
    dedupe_key       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT jobs_queue_not_empty CHECK (queue <> ''),
    CONSTRAINT jobs_handler_not_empty CHECK (handler <> ''),
    CONSTRAINT jobs_payload_is_object CHECK (jsonb_typeof(payload) = 'object'),
    CONSTRAINT jobs_attempts_in_range CHECK (attempts >= 0 AND attempts <= max_attempts),
    CONSTRAINT jobs_max_attempts_positive CHECK (max_attempts > 0),
    -- A running job has an owner and a lease; every other status has neither.
    CONSTRAINT jobs_running_has_lease CHECK (
        (status = 'running') = (locked_by IS NOT NULL)
        AND (locked_by IS NULL) = (locked_until IS NULL)),
    CONSTRAINT jobs_running_was_started CHECK (status <> 'running' OR started_at IS NOT NULL),
    -- Finished exactly when the status is final.
    CONSTRAINT jobs_finished_when_final CHECK (
        (status IN ('completed', 'dead', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT jobs_result_only_when_completed CHECK (result IS NULL OR status = 'completed')
);

ALTER SEQUENCE @schema@.jobs_id_seq OWNED BY @schema@.jobs.id;

-- The claim walks this index in ORDER BY order, once per served handler; finished jobs
-- are not in it, so history of any size costs the claim nothing.
CREATE INDEX jobs_pending_order_idx ON @schema@.jobs (handler, priority, run_at, id)
    WHERE status = 'pending';
-- Expired-lease lookup for the claim's rescue branch.
CREATE INDEX jobs_running_lease_idx ON @schema@.jobs (locked_until)
    WHERE status = 'running';
-- Dedupe: one live (pending or running) job per key and handler (0004: keys were global,
-- so one client could squat another application's key).
CREATE UNIQUE INDEX jobs_dedupe_live_idx ON @schema@.jobs (dedupe_key, handler)
    WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running');
-- Retention pruning and operators' look-ups of finished jobs.
CREATE INDEX jobs_finished_at_idx ON @schema@.jobs (finished_at)
    WHERE finished_at IS NOT NULL;

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

-- The registry of daemons, for status, drain and stale-daemon detection (0002).

CREATE TABLE @schema@.workers (
    id              text PRIMARY KEY,
    host            text NOT NULL,
    pid             integer NOT NULL,
    version         text NOT NULL,
    queues          text[] NOT NULL DEFAULT '{}',
    handlers        text[] NOT NULL DEFAULT '{}',
    slots           integer NOT NULL CHECK (slots >= 0),
    in_flight       bigint[] NOT NULL DEFAULT '{}',
    state           text NOT NULL DEFAULT 'starting'
                    CHECK (state IN ('starting', 'running', 'draining', 'drained', 'stopping',
                                     'gone')),
    -- Set by `pgworkerd drain`, cleared by `pgworkerd resume`; the daemon reads it.
    drain_requested boolean NOT NULL DEFAULT false,
    started_at      timestamptz NOT NULL DEFAULT now(),
    heartbeat_at    timestamptz NOT NULL DEFAULT now(),
    stopped_at      timestamptz
);

CREATE INDEX workers_host_idx ON @schema@.workers (host);
-- Live daemons (0007): stale marking, drain, resume and status ask for state <> 'gone'.
CREATE INDEX workers_live_idx ON @schema@.workers (heartbeat_at) WHERE state <> 'gone';

-- Claiming jobs (0003): one function, so that it runs with JIT off for every caller (see
-- the migration for why) and any language can claim; its search_path pinned (0004).
-- Superseded by claim_jobs (0019); kept for release 0.2 (its COMMENT says who calls it).

CREATE FUNCTION @schema@.claim(
    worker text,
    queues text[],
    handlers text[],
    lease_seconds float8[],         -- per handler: the lease a claimed job gets
    free integer[],                 -- per handler: how many more jobs it may take
    max_jobs integer,               -- in all
    handler_max_attempts integer[] DEFAULT NULL  -- per handler: overrides the job's own
)
RETURNS TABLE (
    id bigint, queue text, handler text, payload jsonb, priority integer, attempts integer,
    max_attempts integer, lease_token bigint, checkpoint jsonb, run_at timestamptz,
    created_at timestamptz, locked_until timestamptz, rescued boolean
)
LANGUAGE plpgsql
-- SECURITY INVOKER: callers need UPDATE on the jobs table (pgworkerd_daemon has it), so
-- EXECUTE can stay granted to everyone.
SET jit = off
-- Names resolve in pg_catalog only: an operator or function someone created in a schema
-- on the caller's search_path (public, up to PostgreSQL 14) cannot stand in for a
-- built-in and run as the daemon. Every table and type in the body is schema-qualified.
SET search_path = pg_catalog, pg_temp
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
    WITH served AS (
        SELECT * FROM unnest((SELECT claim.handlers), (SELECT claim.lease_seconds),
                             (SELECT claim.free),
                             (SELECT claim.handler_max_attempts))
                 AS s(handler, lease_seconds, free, max_attempts)
        -- a drain takes effect at once, even before the daemon's next heartbeat reads it
        WHERE NOT EXISTS (SELECT 1 FROM @schema@.workers w
                           WHERE w.id = (SELECT claim.worker) AND w.drain_requested)
    ), due AS (
        -- per handler, so a capped handler's backlog cannot hide another handler's jobs
        SELECT d.id, d.priority, d.run_at, s.handler FROM served s CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_at FROM @schema@.jobs j
            WHERE j.status = 'pending' AND j.run_at <= now() AND j.handler = s.handler
              AND j.queue = ANY((SELECT claim.queues)::text[])
            ORDER BY j.priority, j.run_at, j.id
            LIMIT least(s.free, (SELECT claim.max_jobs))
            FOR UPDATE SKIP LOCKED) d
    ), expired AS (
        SELECT j.id, j.priority, j.run_at, j.handler,
               (j.attempts >= j.max_attempts OR j.cancel_requested) AS finished
        FROM @schema@.jobs j
        WHERE j.status = 'running' AND j.locked_until < now()
          AND j.queue = ANY((SELECT claim.queues)::text[])
          AND j.handler = ANY((SELECT claim.handlers)::text[])
        ORDER BY j.locked_until
        LIMIT (SELECT claim.max_jobs)
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
        LIMIT (SELECT claim.max_jobs)
    )
    UPDATE @schema@.jobs j
       SET status = 'running',
           locked_by = claim.worker,
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

-- Finishing a claimed job from SQL (0005): what the daemon's statements do for one job,
-- for workers in any language. SECURITY INVOKER (pgworkerd_daemon's rights), search_path
-- pinned; a lost lease changes nothing and each function says so.

-- Renew a lease for lease_seconds more, saving progress and a checkpoint (NULL keeps the
-- saved ones). No row: the lease was lost, stop the job. cancel_requested: stop the job
-- and record the attempt with fail_job (it then becomes cancelled).
CREATE FUNCTION @schema@.renew_lease(
    job_id bigint, worker text, token bigint, lease_seconds float8,
    progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS TABLE (cancel_requested boolean, locked_until timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- As the daemon's statements (0019): a durable commit whatever the server's default,
    -- and the job found by its primary key only (its status compared as text).
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    RETURN QUERY
    UPDATE @schema@.jobs j
       SET locked_until = now() + make_interval(secs => renew_lease.lease_seconds),
           progress = coalesce(renew_lease.progress, j.progress),
           checkpoint = coalesce(renew_lease.checkpoint, j.checkpoint),
           updated_at = now()
     WHERE j.id = renew_lease.job_id AND j.locked_by = renew_lease.worker
       AND j.lease_token = renew_lease.token AND j.status::text = 'running'
    RETURNING j.cancel_requested, j.locked_until;
END;
$$;

-- Completed, with a result (jsonb or NULL) and final progress (NULL keeps the saved).
-- False: the lease was lost and nothing changed.
CREATE FUNCTION @schema@.complete_job(
    job_id bigint, worker text, token bigint, result jsonb DEFAULT NULL,
    progress jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- As the daemon's statements (0019): a durable commit whatever the server's default,
    -- and the job found by its primary key only (its status compared as text).
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    UPDATE @schema@.jobs j
       SET status = 'completed', result = complete_job.result,
           progress = coalesce(complete_job.progress, j.progress),
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           finished_at = now(), updated_at = now()
     WHERE j.id = complete_job.job_id AND j.locked_by = complete_job.worker
       AND j.lease_token = complete_job.token AND j.status::text = 'running';
    RETURN FOUND;
END;
$$;

-- A failed attempt with its error text: pending again after
-- backoff_base * 2^(attempt-1) seconds (+-25 % jitter, at most backoff_max), dead once
-- max_attempts are used, cancelled if a cancel was requested meanwhile; progress and a
-- checkpoint for the next attempt are saved with it (NULL keeps the saved ones).
-- No row: the lease was lost and nothing changed.
CREATE FUNCTION @schema@.fail_job(
    job_id bigint, worker text, token bigint, error text,
    backoff_base float8 DEFAULT 10, backoff_max float8 DEFAULT 3600,
    progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS TABLE (status text, run_at timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- As the daemon's statements (0019): a durable commit whatever the server's default,
    -- and the job found by its primary key only (its status compared as text).
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    RETURN QUERY
    UPDATE @schema@.jobs j
       SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                         WHEN j.attempts >= j.max_attempts THEN 'dead'
                         ELSE 'pending' END::@schema@.job_status,
           run_at = CASE WHEN j.cancel_requested OR j.attempts >= j.max_attempts THEN j.run_at
                         ELSE now() + make_interval(secs =>
                              least(fail_job.backoff_max,
                                    fail_job.backoff_base
                                    * power(2::float8, least(j.attempts - 1, 60)::float8))
                              * (0.75 + 0.5 * random())) END,
           finished_at = CASE WHEN j.cancel_requested OR j.attempts >= j.max_attempts
                              THEN now() END,
           last_error = fail_job.error,
           progress = coalesce(fail_job.progress, j.progress),
           checkpoint = coalesce(fail_job.checkpoint, j.checkpoint),
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           updated_at = now()
     WHERE j.id = fail_job.job_id AND j.locked_by = fail_job.worker
       AND j.lease_token = fail_job.token AND j.status::text = 'running'
    RETURNING j.status::text, j.run_at;
END;
$$;

-- Hand a job back without counting the attempt (shutting down): pending at once in its
-- old place in the queue (cancelled if a cancel was requested), with progress and a
-- checkpoint (NULL keeps the saved ones). Returns the new status; NULL: the lease was lost.
CREATE FUNCTION @schema@.release_job(
    job_id bigint, worker text, token bigint,
    progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    new_status text;
BEGIN
    -- As the daemon's statements (0019): a durable commit whatever the server's default,
    -- and the job found by its primary key only (its status compared as text).
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    UPDATE @schema@.jobs j
       SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                         ELSE 'pending' END::@schema@.job_status,
           finished_at = CASE WHEN j.cancel_requested THEN now() END,
           attempts = j.attempts - 1,
           progress = coalesce(release_job.progress, j.progress),
           checkpoint = coalesce(release_job.checkpoint, j.checkpoint),
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           updated_at = now()
     WHERE j.id = release_job.job_id AND j.locked_by = release_job.worker
       AND j.lease_token = release_job.token AND j.status::text = 'running'
    RETURNING j.status::text INTO new_status;
    RETURN new_status;
END;
$$;

-- Claiming jobs, each handler from its own queues (0006): claim() plus handler_queues, the
-- queues each handler claims from (JSON, null for every queue of the claim). claim()
-- stays for daemons of schema 5 (README "Upgrading"). Superseded by claim_jobs (0019).

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

-- Fleet-wide concurrency limits, concurrency keys, pausing queues and handlers (0009):
-- see the migration's header. enqueue, enqueue_many, claim() and claim_v2 stay for the
-- code that calls them (release 0.2, code of schema 8); they know no key, limit or pause.

ALTER TABLE @schema@.jobs ADD COLUMN concurrency_key text;

-- claim_v3 counts the current leases of each limited handler (and of each of its keys)
-- here: only running jobs are in it, so its size is the fleet's running jobs, never the
-- backlog or the history. locked_until is carried for the lease test.
CREATE INDEX jobs_running_handler_key_idx ON @schema@.jobs (handler, concurrency_key)
    INCLUDE (locked_until)
    WHERE status = 'running';

-- Queues and handlers paused fleet-wide: claim_v3 claims none of their jobs (pending
-- ones stay pending; running ones finish normally). A few rows at most.
CREATE TABLE @schema@.paused (
    kind      text NOT NULL,
    name      text NOT NULL,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text NOT NULL DEFAULT session_user,
    comment   text,
    PRIMARY KEY (kind, name),
    CONSTRAINT paused_kind_known CHECK (kind IN ('queue', 'handler'))
);

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

-- Pause and resume. Idempotent: pausing what is paused keeps its first pause (time, role
-- and comment) and returns false; resuming what is not paused returns false. A name is
-- checked like a queue or handler name at enqueue (anything else could never match a
-- job). Definer's rights: callers need EXECUTE only (deploy/roles.sql grants it to
-- pgworkerd_daemon, the operators' role); paused_by is the caller's session role.
CREATE FUNCTION @schema@.pause(kind text, name text, comment text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    added integer;
BEGIN
    IF kind IS NULL OR kind NOT IN ('queue', 'handler') THEN
        RAISE EXCEPTION 'pgworkerd: can pause a queue or a handler, not %',
            coalesce(quote_literal(kind), 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF name IS NULL OR NOT @schema@.enqueue_name_ok(name) THEN
        RAISE EXCEPTION 'pgworkerd: % name must be a non-empty printable name of at most 128 '
            'characters', kind USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF char_length(comment) > 500 THEN
        RAISE EXCEPTION 'pgworkerd: comment must be at most 500 characters, not %',
            char_length(comment) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO @schema@.paused AS p (kind, name, comment)
    VALUES (pause.kind, pause.name, pause.comment)
    ON CONFLICT ON CONSTRAINT paused_pkey DO NOTHING;
    GET DIAGNOSTICS added = ROW_COUNT;
    RETURN added > 0;
END;
$$;

CREATE FUNCTION @schema@.resume(kind text, name text)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    removed integer;
BEGIN
    IF kind IS NULL OR kind NOT IN ('queue', 'handler') THEN
        RAISE EXCEPTION 'pgworkerd: can resume a queue or a handler, not %',
            coalesce(quote_literal(kind), 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM @schema@.paused p WHERE p.kind = resume.kind AND p.name = resume.name;
    GET DIAGNOSTICS removed = ROW_COUNT;
    IF removed > 0 THEN
        -- wake the daemons: their jobs are claimable again (the payload is not read)
        PERFORM pg_notify(@schema_literal@ || '.jobs', resume.name);
    END IF;
    RETURN removed > 0;
END;
$$;

CREATE FUNCTION @schema@.pause_queue(name text, comment text DEFAULT NULL)
RETURNS boolean LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN @schema@.pause('queue', name, comment);

CREATE FUNCTION @schema@.resume_queue(name text)
RETURNS boolean LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN @schema@.resume('queue', name);

CREATE FUNCTION @schema@.pause_handler(name text, comment text DEFAULT NULL)
RETURNS boolean LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN @schema@.pause('handler', name, comment);

CREATE FUNCTION @schema@.resume_handler(name text)
RETURNS boolean LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN @schema@.resume('handler', name);

REVOKE EXECUTE ON FUNCTION @schema@.pause(text, text, text), @schema@.resume(text, text),
    @schema@.pause_queue(text, text), @schema@.resume_queue(text),
    @schema@.pause_handler(text, text), @schema@.resume_handler(text) FROM PUBLIC;

-- claim_v3: claim_v2 plus fleet-wide limits and pauses. Since 0019 the implementation
-- behind claim_jobs, which new code calls (its COMMENT says who still calls it directly).
--   SELECT * FROM pgworkerd.claim_v3('worker-1', '{default,mail}', '{send_mail,export}',
--                                    '{300,60}', '{4,4}', 8, NULL, NULL,
--                                    '{NULL,10}', '{NULL,2}');
-- max_running: per handler, at most this many current leases across the fleet (NULL: no
-- limit). max_running_per_key: per handler, at most this many current leases per
-- concurrency key (NULL: no limit; jobs without a key are not limited by it).
--
-- Why counting alone is not enough: two daemons claiming at once each count the same
-- committed leases, each see room for one more, and both take it (SKIP LOCKED makes them
-- skip each other's rows, not each other's counts). So a claim that applies a limit first
-- takes a transaction-level advisory lock per limited handler, keyed on (schema,
-- handler), in one fixed order (sorted by name in the "C" collation, so two claims never
-- wait for each other crosswise: no deadlock), in a statement of its own BEFORE the
-- statement that counts: in this VOLATILE function every statement takes a new snapshot
-- (READ COMMITTED), so the count sees every claim committed before the lock was granted,
-- and the claim that held the lock has committed (locks are released after the commit is
-- visible). A lock taken inside the counting statement would be granted after that
-- statement's snapshot was taken, and the count could miss the claim it waited for.
-- Handlers without limits take no lock: their claims pay one empty CTE and nothing else.
--
-- Each claim applies its own caller's limits: two daemons configured with different
-- limits for one handler each hold the fleet to their own number when they claim (a
-- daemon with no limit for it takes no lock and counts nothing). Release 0.2 daemons
-- (claim()) and daemons of schema 8 (claim_v2) know no limits and no pauses.
CREATE FUNCTION @schema@.claim_v3(
    worker text,
    queues text[],
    handlers text[],
    lease_seconds float8[],         -- per handler: the lease a claimed job gets
    free integer[],                 -- per handler: how many more jobs it may take here
    max_jobs integer,               -- in all
    handler_max_attempts integer[] DEFAULT NULL,  -- per handler: overrides the job's own
    -- per handler: a JSON array of the queues (among `queues`) it claims from, or null
    -- for all of them; the whole argument NULL: every handler claims from all of them
    handler_queues jsonb DEFAULT NULL,
    max_running integer[] DEFAULT NULL,          -- per handler: fleet-wide, or NULL
    max_running_per_key integer[] DEFAULT NULL   -- per handler: per key, or NULL
)
RETURNS TABLE (
    id bigint, queue text, handler text, payload jsonb, priority integer, attempts integer,
    max_attempts integer, lease_token bigint, checkpoint jsonb, run_at timestamptz,
    created_at timestamptz, locked_until timestamptz, rescued boolean
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- SECURITY INVOKER: callers need UPDATE on the jobs table and SELECT on paused
-- (pgworkerd_daemon has both), so EXECUTE can stay granted to everyone.
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    limited text;
    -- handlers with a per-key limit in this call: they may need a second pass
    keyed text[] := ARRAY(SELECT s.h FROM unnest(claim_v3.handlers, claim_v3.max_running_per_key)
                                            AS s(h, k) WHERE s.k IS NOT NULL);
    taken text[] := '{}';  -- the handler of each job claimed by the passes so far
    jobs_left integer := claim_v3.max_jobs;
    got bigint;
    pass integer := 0;
BEGIN
    -- The locks: one statement, before the one that counts (see above). FOR ... LOOP
    -- takes them one by one in the order of the sorted query.
    FOR limited IN
        SELECT DISTINCT s.h COLLATE "C"
          FROM unnest(claim_v3.handlers, claim_v3.max_running, claim_v3.max_running_per_key)
               AS s(h, m, k)
         WHERE (s.m IS NOT NULL OR s.k IS NOT NULL)
         ORDER BY 1
    LOOP
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            -- one snapshot for the whole transaction: the count could not see the claims
            -- committed while this one waited for the lock
            RAISE EXCEPTION 'pgworkerd: claim_v3 with limits needs READ COMMITTED, not %',
                current_setting('transaction_isolation')
                USING ERRCODE = 'invalid_transaction_state';
        END IF;
        PERFORM pg_advisory_xact_lock(hashtext(@schema_literal@ || '.max_running'),
                                      hashtext(limited));
    END LOOP;

    -- claim_v2's statement (see 0006 for its plan), plus: `room` per handler (its free
    -- slots here, capped by what its fleet-wide limit leaves), the keys that are full
    -- (filtered out of the candidates, so a full key's backlog never takes the place of
    -- other keys' jobs in a batch), the per-key ranking that keeps one batch within what
    -- each key has left, and the paused queues and handlers left out altogether.
    --
    -- Why more than one pass: the candidates of a handler are its best `room` pending
    -- jobs that are not of a full key, and the per-key ranking then keeps at most what
    -- each key has left. When the best jobs are mostly of one key that has room for
    -- only some of them, the batch comes out short although jobs of other keys wait.
    -- The keys it filled are full for the next pass (this transaction sees its own
    -- claims), which then takes the others. Only handlers with a per-key limit ever
    -- need it, and only while a pass still claims something.
    LOOP
    pass := pass + 1;
    RETURN QUERY
    WITH wanted AS (
        SELECT s.handler, s.lease_seconds,
               -- what earlier passes took of this daemon's free slots
               s.free - coalesce(cardinality(array_positions(taken, s.handler)), 0) AS free,
               s.max_attempts,
               s.max_running, s.per_key,
               CASE WHEN jsonb_typeof((SELECT claim_v3.handler_queues) -> (s.n::integer - 1))
                         = 'array'
                    THEN ARRAY(SELECT jsonb_array_elements_text(
                                   (SELECT claim_v3.handler_queues) -> (s.n::integer - 1)))
               END AS queues
        FROM unnest((SELECT claim_v3.handlers), (SELECT claim_v3.lease_seconds),
                    (SELECT claim_v3.free), (SELECT claim_v3.handler_max_attempts),
                    (SELECT claim_v3.max_running), (SELECT claim_v3.max_running_per_key))
             WITH ORDINALITY AS s(handler, lease_seconds, free, max_attempts, max_running,
                                  per_key, n)
        WHERE NOT EXISTS (SELECT 1 FROM @schema@.paused p
                           WHERE p.kind = 'handler' AND p.name = s.handler)
    ), open_queues AS (
        SELECT ARRAY(SELECT q FROM unnest((SELECT claim_v3.queues)::text[]) AS q
                      WHERE NOT EXISTS (SELECT 1 FROM @schema@.paused p
                                         WHERE p.kind = 'queue' AND p.name = q)) AS queues
    ), key_used AS (
        -- current leases per key of the handlers with a per-key limit
        SELECT s.handler, k.concurrency_key, k.n
        FROM wanted s CROSS JOIN LATERAL (
            SELECT r.concurrency_key, count(*) AS n FROM @schema@.jobs r
            WHERE r.status = 'running' AND r.handler = s.handler
              AND r.concurrency_key IS NOT NULL AND r.locked_until > now()
            GROUP BY r.concurrency_key) k
        WHERE s.per_key IS NOT NULL
    ), served AS (
        SELECT s.handler, s.lease_seconds, s.max_attempts, s.queues, s.per_key,
               CASE WHEN s.max_running IS NULL THEN s.free
                    ELSE least(s.free, s.max_running - (
                        SELECT count(*) FROM @schema@.jobs r
                        WHERE r.status = 'running' AND r.handler = s.handler
                          AND r.locked_until > now())::integer) END AS room,
               CASE WHEN s.per_key IS NOT NULL
                    THEN ARRAY(SELECT k.concurrency_key FROM key_used k
                                WHERE k.handler = s.handler AND k.n >= s.per_key) END
                   AS full_keys
        FROM wanted s
        -- a drain takes effect at once, even before the daemon's next heartbeat reads it
        WHERE NOT EXISTS (SELECT 1 FROM @schema@.workers w
                           WHERE w.id = (SELECT claim_v3.worker) AND w.drain_requested)
    ), due AS (
        -- per handler, so a capped handler's backlog cannot hide another handler's jobs;
        -- a handler at its limit has no room and is not looked at
        SELECT d.id, d.priority, d.run_at, d.concurrency_key, s.handler
        FROM served s CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_at, j.concurrency_key FROM @schema@.jobs j
            WHERE j.status = 'pending' AND j.run_at <= now() AND j.handler = s.handler
              AND j.queue = ANY((SELECT o.queues FROM open_queues o)::text[])
              AND (s.queues IS NULL OR j.queue = ANY(s.queues))
              AND (s.full_keys IS NULL OR j.concurrency_key IS NULL
                   OR j.concurrency_key <> ALL(s.full_keys))
            ORDER BY j.priority, j.run_at, j.id
            LIMIT greatest(0, least(s.room, (SELECT jobs_left)))
            FOR UPDATE SKIP LOCKED) d
        WHERE s.room > 0
    ), expired AS (
        -- Paused queues and handlers are left out here too: their expired jobs are neither
        -- run again nor buried while paused (they stop counting against limits, their
        -- leases being over), and the first claim after the resume rescues them.
        SELECT j.id, j.priority, j.run_at, j.handler, j.concurrency_key,
               (j.attempts >= j.max_attempts OR j.cancel_requested) AS finished
        FROM @schema@.jobs j
        WHERE j.status = 'running' AND j.locked_until < now()
          AND j.queue = ANY((SELECT o.queues FROM open_queues o)::text[])
          AND EXISTS (SELECT 1 FROM served s
                       WHERE s.handler = j.handler AND s.room > 0
                         AND (s.queues IS NULL OR j.queue = ANY(s.queues))
                         AND (s.full_keys IS NULL OR j.concurrency_key IS NULL
                              OR j.concurrency_key <> ALL(s.full_keys)))
        ORDER BY j.locked_until
        LIMIT (SELECT jobs_left)
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
    ), candidates AS (
        SELECT id, priority, run_at, handler, concurrency_key, false AS rescued FROM due
        UNION ALL
        SELECT id, priority, run_at, handler, concurrency_key, true FROM expired
        WHERE NOT finished
    ), within_keys AS (
        -- at most what each key has left (per_key minus its current leases), the best
        -- first; jobs without a key and handlers without a per-key limit all pass
        SELECT c.id, c.priority, c.run_at, c.handler, c.rescued FROM (
            SELECT c.*, s.per_key,
                   row_number() OVER (PARTITION BY c.handler, c.concurrency_key
                                      ORDER BY c.priority, c.run_at, c.id) AS nk
            FROM candidates c JOIN served s USING (handler)) c
        WHERE c.per_key IS NULL OR c.concurrency_key IS NULL
           OR c.nk <= c.per_key - coalesce((SELECT k.n FROM key_used k
                                             WHERE k.handler = c.handler
                                               AND k.concurrency_key = c.concurrency_key), 0)
    ), chosen AS (
        -- at most `room` per handler, the best first; due and expired jobs carry what the
        -- ranking needs, so the table is not read again here
        SELECT id, rescued, lease_seconds, max_attempts FROM (
            SELECT c.id, c.priority, c.run_at, c.rescued, s.room, s.lease_seconds,
                   s.max_attempts,
                   row_number() OVER (PARTITION BY c.handler
                                      ORDER BY c.priority, c.run_at, c.id) AS n
            FROM within_keys c JOIN served s USING (handler)) ranked
        WHERE n <= room
        ORDER BY priority, run_at, id
        LIMIT (SELECT jobs_left)
    )
    UPDATE @schema@.jobs j
       SET status = 'running',
           locked_by = claim_v3.worker,
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
    GET DIAGNOSTICS got = ROW_COUNT;
    jobs_left := jobs_left - got::integer;
    EXIT WHEN got = 0 OR jobs_left <= 0 OR cardinality(keyed) = 0 OR pass >= 4;
    -- Which handlers this transaction's passes claimed for: its own claims (this
    -- worker's, started at this transaction's now()).
    taken := ARRAY(SELECT j.handler FROM @schema@.jobs j
                    WHERE j.status = 'running' AND j.handler = ANY(claim_v3.handlers)
                      AND j.locked_by = claim_v3.worker AND j.started_at = now());
    END LOOP;
END;
$$;

-- Periodic jobs (0010, schedules): see the migration for how one job per tick is kept.

-- One row per schedule name: its definition as a daemon last declared it (daemons
-- declare theirs at start and after each reconnect; during a deploy the last one wins).
CREATE TABLE @schema@.schedules (
    name        text PRIMARY KEY CHECK (@schema@.enqueue_name_ok(name)),
    definition  jsonb NOT NULL CHECK (jsonb_typeof(definition) = 'object'),
    declared_by text NOT NULL,
    declared_at timestamptz NOT NULL DEFAULT now(),
    -- ticks after this are the schedule's: a new schedule does not fire its past
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per tick handled: the job it created, or why it created none. No foreign key
-- to jobs: finished jobs are pruned on their own schedule.
CREATE TABLE @schema@.schedule_runs (
    schedule text NOT NULL REFERENCES @schema@.schedules (name) ON DELETE CASCADE,
    tick     timestamptz NOT NULL,
    job_id   bigint,
    skipped  text,
    fired_by text NOT NULL,
    fired_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, tick),
    CONSTRAINT schedule_runs_job_or_reason CHECK ((job_id IS NULL) <> (skipped IS NULL))
);

-- Which schedules each daemon declares: `pgworkerd schedules` shows whether a live daemon
-- declares a schedule now (a schedule removed from every config stops firing).
ALTER TABLE @schema@.workers ADD COLUMN schedules text[] NOT NULL DEFAULT '{}';

-- The overlap check reads a schedule's latest runs that created a job.
CREATE INDEX schedule_runs_jobs_idx ON @schema@.schedule_runs (schedule, tick DESC)
    WHERE job_id IS NOT NULL;

-- Record a daemon's definition of a schedule; returns the tick up to which the schedule
-- is handled: its latest run, or when it was first declared.
CREATE FUNCTION @schema@.schedule_declare(name text, definition jsonb, worker text)
RETURNS timestamptz
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO @schema@.schedules AS s (name, definition, declared_by)
    VALUES (schedule_declare.name, schedule_declare.definition, schedule_declare.worker)
    ON CONFLICT (name) DO UPDATE
        SET definition = excluded.definition, declared_by = excluded.declared_by,
            declared_at = now()
    RETURNING greatest(s.created_at,
                       (SELECT max(r.tick) FROM @schema@.schedule_runs r
                         WHERE r.schedule = s.name));
$$;

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
CREATE FUNCTION @schema@.schedule_fire(
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
    job_id := (@schema@.enqueue_many(jsonb_build_array(job)))[1];
    INSERT INTO @schema@.schedule_runs (schedule, tick, job_id, fired_by)
    VALUES (name, tick, schedule_fire.job_id, worker);
    outcome := 'fired';
END;
$$;

-- Delete run rows older than `older_than`, keeping each schedule's latest (its last run
-- and the point catch-up counts from); returns how many.
CREATE FUNCTION @schema@.schedule_runs_prune(older_than interval)
RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH deleted AS (
        DELETE FROM @schema@.schedule_runs r
         WHERE r.fired_at < now() - older_than
           AND r.tick < (SELECT max(l.tick) FROM @schema@.schedule_runs l
                          WHERE l.schedule = r.schedule)
        RETURNING 1
    )
    SELECT count(*) FROM deleted;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.schedule_declare(text, jsonb, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION @schema@.schedule_fire(text, timestamptz, jsonb, text, text)
    FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION @schema@.schedule_runs_prune(interval) FROM PUBLIC;

-- Handler-controlled outcomes and the completion notification (0011, outcomes).
-- Snoozes of the job (pgworkerd.Snooze): each hands its attempt back uncounted, so this
-- count is what a handler's max_snoozes bounds.
ALTER TABLE @schema@.jobs
    ADD COLUMN snoozes integer NOT NULL DEFAULT 0
    CONSTRAINT jobs_snoozes_not_negative CHECK (snoozes >= 0);

-- NOTIFY '<schema>.finished' (payload: the job id) whenever a job reaches a final status,
-- by whatever path; pgworkerd.wait() listens for it.
CREATE FUNCTION @schema@.notify_finished()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify(@schema_literal@ || '.finished', NEW.id::text);
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_notify_finished
    AFTER UPDATE OF status ON @schema@.jobs
    FOR EACH ROW
    WHEN (NEW.status IN ('completed', 'dead', 'cancelled')
          AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION @schema@.notify_finished();

-- Finishing a claimed job from SQL with the outcomes a handler may choose (next to 0005's
-- complete_job, fail_job, release_job; tests/integration/test_sql_finish.py holds them
-- equal to the daemon's statements). Fenced by the lease like those; SECURITY INVOKER.

-- The handler asked to run again in delay_seconds (0 to 2592000, 30 days; anything else
-- raises 22023 and changes nothing), which is not a failure: pending again at
-- now() + delay, the attempt not counted, snoozes + 1 (cancelled instead if a cancel was
-- requested), progress and a checkpoint saved (NULL keeps the saved ones), last_error
-- kept. A job that has snoozed max_snoozes times already gets a failed attempt instead
-- (fail_job with its default backoff, the error saying why). Returns the new status and
-- run_at; no row: the lease was lost and nothing changed.
CREATE FUNCTION @schema@.snooze_job(
    job_id bigint, worker text, token bigint, delay_seconds float8,
    max_snoozes integer DEFAULT 100,
    progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS TABLE (status text, run_at timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- As the daemon's statements (0019): a durable commit whatever the server's default,
    -- and the job found by its primary key only (its status compared as text).
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    -- (NaN is above every number in PostgreSQL: refused too)
    IF snooze_job.delay_seconds IS NULL
       OR NOT (snooze_job.delay_seconds BETWEEN 0 AND 2592000) THEN
        RAISE EXCEPTION 'pgworkerd: a snooze must be from 0 to 2592000 seconds (30 days), not %',
            coalesce(snooze_job.delay_seconds::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    UPDATE @schema@.jobs j
       SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                         ELSE 'pending' END::@schema@.job_status,
           run_at = CASE WHEN j.cancel_requested THEN j.run_at
                         ELSE now() + make_interval(secs => snooze_job.delay_seconds) END,
           finished_at = CASE WHEN j.cancel_requested THEN now() END,
           attempts = j.attempts - 1,
           snoozes = j.snoozes + 1,
           progress = coalesce(snooze_job.progress, j.progress),
           checkpoint = coalesce(snooze_job.checkpoint, j.checkpoint),
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           updated_at = now()
     WHERE j.id = snooze_job.job_id AND j.locked_by = snooze_job.worker
       AND j.lease_token = snooze_job.token AND j.status::text = 'running'
       AND j.snoozes < coalesce(snooze_job.max_snoozes, 100)
    RETURNING j.status::text, j.run_at;
    IF NOT FOUND THEN
        -- max_snoozes used up (or the lease lost: fail_job is fenced the same way)
        RETURN QUERY
        SELECT * FROM @schema@.fail_job(
            snooze_job.job_id, snooze_job.worker, snooze_job.token,
            'snoozed ' || coalesce(snooze_job.max_snoozes, 100)
                || ' times already (max_snoozes): this snooze counts as a failed attempt',
            progress => snooze_job.progress, checkpoint => snooze_job.checkpoint);
    END IF;
END;
$$;

-- The handler gave up: dead at once, whatever attempts are left, with the reason as
-- last_error. False: the lease was lost and nothing changed.
CREATE FUNCTION @schema@.give_up_job(job_id bigint, worker text, token bigint, reason text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- As the daemon's statements (0019): a durable commit whatever the server's default,
    -- and the job found by its primary key only (its status compared as text).
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    UPDATE @schema@.jobs j
       SET status = 'dead', last_error = give_up_job.reason,
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           finished_at = now(), updated_at = now()
     WHERE j.id = give_up_job.job_id AND j.locked_by = give_up_job.worker
       AND j.lease_token = give_up_job.token AND j.status::text = 'running';
    RETURN FOUND;
END;
$$;

-- Per-attempt history and accounting (0012, attempts).
-- One row per ended attempt: where it ran, how it ended and why, what it cost. Written by
-- the trigger below whatever ended the attempt (a daemon's finish of any release, a
-- worker finishing from SQL, another daemon's claim rescuing an expired lease); the
-- daemon then adds what it measured (attempt_account in queries.sql). Keyed by the
-- attempt's lease token: every claim bumps it, so it names exactly one attempt of the
-- job (an attempt number recurs after a release or a snooze). Removed with its job by
-- the triggers below (not a foreign key: TRUNCATE of jobs keeps working, and a finish
-- does not pay for a key check).
CREATE TABLE @schema@.attempts (
    job_id             bigint NOT NULL,
    lease_token        bigint NOT NULL,
    attempt            integer NOT NULL,
    worker             text,
    host               text,
    started_at         timestamptz,
    finished_at        timestamptz NOT NULL DEFAULT now(),
    outcome            text NOT NULL
                       CONSTRAINT attempts_outcome_known CHECK (outcome IN (
                           'completed', 'failed', 'dead', 'cancelled', 'released',
                           'snoozed', 'lease expired')),
    error              text,
    -- measured by the daemon that ran it (NULL: not measured, e.g. a worker in another
    -- language, a daemon of an older release, or one that died with the attempt)
    wall_seconds       float8,
    cpu_user_seconds   float8,
    cpu_system_seconds float8,
    peak_memory        bigint,  -- bytes, the job's whole process tree
    PRIMARY KEY (job_id, lease_token)
);

-- A running attempt ended because another claim took the job over (its lease ran out and
-- a claim rescued or buried it): say so in words an operator can act on, naming the
-- daemon and its host (the registry's row), ahead of the claim's own text.
CREATE FUNCTION @schema@.attempt_lease_expired()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    where_ran text;
BEGIN
    SELECT ' on ' || w.host INTO where_ran FROM @schema@.workers w WHERE w.id = OLD.locked_by;
    NEW.last_error := 'lease expired: daemon ' || coalesce(OLD.locked_by, '?')
        || coalesce(where_ran, '') || ' stopped renewing'
        || coalesce(' (' || NEW.last_error || ')', '');
    RETURN NEW;
END;
$$;

CREATE TRIGGER jobs_attempt_lease_expired
    BEFORE UPDATE ON @schema@.jobs
    FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.lease_token IS DISTINCT FROM OLD.lease_token)
    EXECUTE FUNCTION @schema@.attempt_lease_expired();

-- Record a running attempt that ended: the job left 'running', or stayed there under a
-- new lease token (rescued). Renewals and claims of pending jobs do not fire it.
CREATE FUNCTION @schema@.attempt_record()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    outcome text;
BEGIN
    outcome := CASE
        WHEN NEW.lease_token IS DISTINCT FROM OLD.lease_token THEN 'lease expired'
        WHEN NEW.status = 'completed' THEN 'completed'
        WHEN NEW.status = 'cancelled' THEN 'cancelled'
        WHEN NEW.status = 'dead' THEN 'dead'
        WHEN NEW.attempts < OLD.attempts AND NEW.snoozes > OLD.snoozes THEN 'snoozed'
        WHEN NEW.attempts < OLD.attempts THEN 'released'
        ELSE 'failed' END;
    INSERT INTO @schema@.attempts AS a
        (job_id, lease_token, attempt, worker, host, started_at, outcome, error,
         wall_seconds)
    VALUES (OLD.id, OLD.lease_token, OLD.attempts, OLD.locked_by,
            (SELECT w.host FROM @schema@.workers w WHERE w.id = OLD.locked_by),
            OLD.started_at, outcome,
            CASE WHEN outcome IN ('failed', 'dead', 'lease expired')
                      OR NEW.last_error IS DISTINCT FROM OLD.last_error
                 THEN NEW.last_error END,
            extract(epoch FROM now() - OLD.started_at)::float8)
    -- (a token is never reused; should a row exist anyway, the first record stands)
    ON CONFLICT (job_id, lease_token) DO NOTHING;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_attempt_record
    AFTER UPDATE ON @schema@.jobs
    FOR EACH ROW
    WHEN (OLD.status = 'running'
          AND (NEW.status <> 'running' OR NEW.lease_token IS DISTINCT FROM OLD.lease_token))
    EXECUTE FUNCTION @schema@.attempt_record();

-- Deleted jobs (`pgworkerd prune`, by whatever role or release) take their history
-- along: one statement per DELETE, however many jobs it removed.
CREATE FUNCTION @schema@.attempt_forget()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        TRUNCATE @schema@.attempts;
    ELSE
        DELETE FROM @schema@.attempts a USING gone g WHERE a.job_id = g.id;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_attempt_forget
    AFTER DELETE ON @schema@.jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.attempt_forget();

CREATE TRIGGER jobs_attempt_forget_all
    AFTER TRUNCATE ON @schema@.jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.attempt_forget();

REVOKE EXECUTE ON FUNCTION @schema@.attempt_lease_expired() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION @schema@.attempt_record() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION @schema@.attempt_forget() FROM PUBLIC;

-- Targeted wake-ups (0013, wake): a notification per inserted batch that names it.

-- After every statement that inserted jobs (enqueue, enqueue_many, their _v2 versions,
-- schedule_fire, a direct INSERT by whatever role): NOTIFY '<schema>.wake' once per queue
-- and handler inserted, the payload a JSON object {"q": queue, "h": handler, "id": the
-- lowest new id, "n": how many}, sent on commit. A statement trigger, so a bulk enqueue
-- of 10,000 jobs of one handler sends one notification, not 10,000. Names longer than
-- enqueue allows (a direct INSERT) are left out of the payload rather than failing the
-- insert on NOTIFY's 8,000-byte limit: daemons treat a payload without names as a wake-up
-- for every handler.
CREATE FUNCTION @schema@.notify_wake()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify(@schema_literal@ || '.wake',
                      CASE WHEN octet_length(a.queue) + octet_length(a.handler) <= 2048
                      THEN json_build_object('q', a.queue, 'h', a.handler,
                                             'id', min(a.id), 'n', count(*))
                      ELSE json_build_object('id', min(a.id), 'n', count(*)) END::text)
       FROM added a
      GROUP BY a.queue, a.handler;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_notify_wake
    AFTER INSERT ON @schema@.jobs
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.notify_wake();

-- Automatic retention (0014, retention).
-- Delete one small batch of finished jobs past their retention: completed, cancelled and
-- dead each with their own (seconds; NULL keeps that status forever), oldest first, at
-- most p_batch rows (1..10000) in all. History rows of a deleted job go with it, in the
-- same statement: the attempts of migration 0012 are removed by its AFTER DELETE
-- trigger on jobs (a table added later that keeps history references jobs ON DELETE
-- CASCADE or does the same).
--
-- One caller at a time per schema, under a transaction-level advisory lock: a caller
-- that finds it taken deletes nothing and gets deleted = NULL at once (someone else is
-- pruning). Rows locked by anyone (an operator's retry, a claim's rescue) are skipped,
-- not waited for, and a batch holds its row locks only for its own short transaction.
-- live_daemons (the registry's daemons not gone) lets each daemon space its calls so
-- that the fleet as a whole looks about once per interval, whatever its size.
--
-- SECURITY DEFINER, owned by the schema owner: the daemon role gets EXECUTE, not DELETE
-- on jobs, so it can remove finished jobs older than a retention and nothing else.
CREATE FUNCTION @schema@.prune_finished_v1(
    p_completed float8, p_cancelled float8, p_dead float8, p_batch integer,
    OUT deleted integer, OUT live_daemons integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    retention float8[] := ARRAY[p_completed, p_cancelled, p_dead];
    statuses @schema@.job_status[] := ARRAY['completed', 'cancelled', 'dead'];
    n integer;
BEGIN
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 10000 THEN
        RAISE EXCEPTION 'prune_finished_v1: batch must be 1..10000, not %', p_batch
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(retention) r WHERE r < 0 OR r = 'NaN'::float8) THEN
        RAISE EXCEPTION 'prune_finished_v1: a retention must be >= 0 seconds'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT count(*) INTO live_daemons FROM @schema@.workers WHERE state <> 'gone';
    IF NOT pg_try_advisory_xact_lock(
            hashtextextended('pgworkerd.retention:' || @schema_literal@, 0)) THEN
        RETURN;  -- deleted stays NULL: another daemon is pruning
    END IF;
    deleted := 0;
    FOR i IN 1..3 LOOP
        CONTINUE WHEN retention[i] IS NULL OR deleted >= p_batch;
        -- jobs_finished_at_idx, oldest first
        DELETE FROM @schema@.jobs
         WHERE id IN (SELECT id FROM @schema@.jobs
                       WHERE finished_at < now() - make_interval(secs => retention[i])
                         AND status = statuses[i]
                       ORDER BY finished_at
                       LIMIT p_batch - deleted
                       FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS n = ROW_COUNT;
        deleted := deleted + n;
    END LOOP;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.prune_finished_v1(float8, float8, float8, integer)
    FROM PUBLIC;

-- Per-attempt job logs (0015, job_logs).

-- One row per attempt that printed something, keyed like the attempt history (0012) by
-- the attempt's lease token (an attempt number recurs after a release or a snooze). The
-- daemon that runs the attempt upserts it at most once a second while it runs and once
-- more when it ended (finished = true). Bounded: `head` is the first half of the
-- daemon's [logs] max_bytes_per_attempt, `tail` the last half; omitted_bytes is what lies
-- between them (0: head followed by tail is the whole output). total_bytes counts every
-- byte the attempt wrote. Text as PostgreSQL can hold it: NULs removed, invalid UTF-8
-- replaced (by the daemon). Removed with its job by the triggers below.
CREATE TABLE @schema@.job_logs (
    job_id        bigint NOT NULL,
    lease_token   bigint NOT NULL,
    attempt       integer NOT NULL,
    worker        text NOT NULL,
    head          text NOT NULL DEFAULT '',
    tail          text NOT NULL DEFAULT '',
    total_bytes   bigint NOT NULL DEFAULT 0,
    omitted_bytes bigint NOT NULL DEFAULT 0,
    finished      boolean NOT NULL DEFAULT false,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, lease_token)
);

-- Deleted jobs (`pgworkerd prune`, retention's prune_finished_v1, any DELETE or TRUNCATE
-- by whatever role) take their logs along: one statement per DELETE.
CREATE FUNCTION @schema@.job_logs_forget()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        TRUNCATE @schema@.job_logs;
    ELSE
        DELETE FROM @schema@.job_logs l USING gone g WHERE l.job_id = g.id;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_logs_forget
    AFTER DELETE ON @schema@.jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.job_logs_forget();

CREATE TRIGGER jobs_logs_forget_all
    AFTER TRUNCATE ON @schema@.jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.job_logs_forget();

REVOKE EXECUTE ON FUNCTION @schema@.job_logs_forget() FROM PUBLIC;

-- What `status`, `explain` and the dashboard read (0016): indexes for the jobs page
-- and the throughput chart, and each daemon's handler settings in the registry.
--
-- An expand migration (README "Upgrading"): a column with a constant default (no table
-- rewrite) and indexes; no function changes, so older daemons run on (they leave
-- handler_settings empty, and `explain` never blames their limits).
--
-- Cost on a live table: migrations run in one transaction, so each CREATE INDEX holds a
-- SHARE lock on jobs while it builds: enqueues, claims and finishes wait until it ends
-- (reads do not). Measured on 10 M finished jobs (README "Reading the queue"): 10 to
-- 60 s per index on 2 loaded CPUs. On a large table build them beforehand without
-- blocking writes,
--     CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_status_id_idx ON pgworkerd.jobs (status, id);
-- (and so on for the others, same names and columns), then migrate: IF NOT EXISTS
-- makes the migration skip what is there.

-- The handler settings a daemon claims with (handler name -> {"queues", "slots",
-- "max_running", "max_running_per_key"}): written at register and heartbeat, read by
-- `explain` to tell whether a fleet-wide or per-key limit holds a job back.
ALTER TABLE @schema@.workers ADD COLUMN handler_settings jsonb NOT NULL DEFAULT '{}';

-- The jobs page (views.jobs_page): newest first, filtered by status, queue or handler,
-- keyset-paginated by id. Full indexes, not partial: the page lists finished jobs too.
-- The page reads one status at a time (a branch per status), so a queue or handler
-- filter finds each status's newest in id order through (queue, status, id) or
-- (handler, status, id), however rare the combination (a (queue, id) index would read
-- every dead job to find that a queue has none).
-- Each costs one index entry per row version (claim, renewals and finish write new row
-- versions; bottom-up deletion keeps the churn in check), measured in bench/.
CREATE INDEX IF NOT EXISTS jobs_status_id_idx ON @schema@.jobs (status, id);
CREATE INDEX IF NOT EXISTS jobs_queue_status_id_idx ON @schema@.jobs (queue, status, id);
CREATE INDEX IF NOT EXISTS jobs_handler_status_id_idx ON @schema@.jobs (handler, status, id);

-- Throughput and failures over the last hour (views.throughput): attempts by end time.
-- Append-only (one row per ended attempt), so it costs one entry per attempt.
CREATE INDEX IF NOT EXISTS attempts_finished_at_idx ON @schema@.attempts (finished_at);

-- Hand-back drains (0017).

-- The hand-back drain (pgworkerd drain --hand-back): on top of drain_requested (stop
-- claiming), a request to hand running jobs back. NULL hand_back_requested_at: none.
-- hand_back_grace NULL: each handler's stop_grace (the daemon's config); the filters
-- NULL: every queue / every handler (both given: jobs of those handlers on those queues).
-- hand_back_seen_at: the request the daemon last read (its heartbeat copies
-- hand_back_requested_at), so that `drain --wait` knows the daemon has acted on it.
ALTER TABLE @schema@.workers
    ADD COLUMN hand_back_requested_at timestamptz,
    ADD COLUMN hand_back_grace interval,
    ADD COLUMN hand_back_queues text[],
    ADD COLUMN hand_back_handlers text[],
    ADD COLUMN hand_back_seen_at timestamptz;

-- A queue or handler filter of a hand-back: NULL (all), or 1 to 100 valid names.
CREATE FUNCTION @schema@.drain_names_ok(names text[])
RETURNS boolean
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
RETURN names IS NULL
    OR (cardinality(names) BETWEEN 1 AND 100
        AND array_ndims(names) = 1
        AND NOT EXISTS (SELECT 1 FROM unnest(names) AS n
                         WHERE n IS NULL OR NOT @schema@.enqueue_name_ok(n)));

-- Ask live daemons to drain: one id (target_worker), one host (target_host), or all (both
-- NULL). hand_back false: a plain drain (stop claiming, let jobs finish). hand_back true:
-- stop claiming what is targeted (only_queues / only_handlers; NULL: all) and hand back
-- the targeted running jobs after the grace (NULL: each handler's stop_grace; 0 to 1 day).
-- On a daemon with a hand-back in place: the filters widen to the union (NULL wins), the
-- shorter of two given graces is kept, and a daemon keeps each job's earliest hand-back
-- time of the requests it read (a second request never gives a job more time). A plain
-- drain never takes a hand-back back; drain_lift does. An unfiltered hand-back also sets
-- drain_requested, so daemons of older code at least stop claiming.
-- Returns the daemons asked (none: no live daemon matched). Definer's rights: callers
-- need EXECUTE only (deploy/roles.sql). The daemons hear of it at once ({"registry":
-- "drain"} on the wake channel: a hint; the row is the authority).
CREATE FUNCTION @schema@.drain_request(target_worker text, target_host text,
                                       hand_back boolean DEFAULT false,
                                       grace interval DEFAULT NULL,
                                       only_queues text[] DEFAULT NULL,
                                       only_handlers text[] DEFAULT NULL)
RETURNS TABLE (id text, host text, pid integer, state text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF target_worker IS NOT NULL AND target_host IS NOT NULL THEN
        RAISE EXCEPTION 'pgworkerd: give a daemon id or a host, not both'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF hand_back IS NULL THEN
        RAISE EXCEPTION 'pgworkerd: hand_back must be true or false, not NULL'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT hand_back AND (grace IS NOT NULL OR only_queues IS NOT NULL
                          OR only_handlers IS NOT NULL) THEN
        RAISE EXCEPTION 'pgworkerd: a grace and queue or handler filters apply to a hand-back '
            'only (a plain drain lets every job finish)' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF grace < interval '0' OR grace > interval '1 day' THEN
        RAISE EXCEPTION 'pgworkerd: the grace must be from 0 to 1 day, not %', grace
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT @schema@.drain_names_ok(only_queues) THEN
        RAISE EXCEPTION 'pgworkerd: queues must be 1 to 100 non-empty printable names of at '
            'most 128 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT @schema@.drain_names_ok(only_handlers) THEN
        RAISE EXCEPTION 'pgworkerd: handlers must be 1 to 100 non-empty printable names of at '
            'most 128 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH changed AS (
        UPDATE @schema@.workers w
           SET drain_requested = w.drain_requested
                   OR NOT hand_back
                   OR (w.hand_back_requested_at IS NULL
                       AND only_queues IS NULL AND only_handlers IS NULL)
                   OR (w.hand_back_requested_at IS NOT NULL
                       AND (only_queues IS NULL OR w.hand_back_queues IS NULL)
                       AND (only_handlers IS NULL OR w.hand_back_handlers IS NULL)),
               hand_back_requested_at = CASE WHEN hand_back THEN clock_timestamp()
                                             ELSE w.hand_back_requested_at END,
               hand_back_grace = CASE
                   WHEN NOT hand_back THEN w.hand_back_grace
                   WHEN w.hand_back_requested_at IS NULL THEN grace
                   WHEN grace IS NULL OR w.hand_back_grace IS NULL THEN grace
                   ELSE least(grace, w.hand_back_grace) END,
               hand_back_queues = CASE
                   WHEN NOT hand_back THEN w.hand_back_queues
                   WHEN only_queues IS NULL THEN NULL
                   WHEN w.hand_back_requested_at IS NOT NULL AND w.hand_back_queues IS NULL
                       THEN NULL
                   ELSE ARRAY(SELECT DISTINCT unnest(coalesce(w.hand_back_queues, '{}')
                                                     || only_queues)
                               ORDER BY 1) END,
               hand_back_handlers = CASE
                   WHEN NOT hand_back THEN w.hand_back_handlers
                   WHEN only_handlers IS NULL THEN NULL
                   WHEN w.hand_back_requested_at IS NOT NULL AND w.hand_back_handlers IS NULL
                       THEN NULL
                   ELSE ARRAY(SELECT DISTINCT unnest(coalesce(w.hand_back_handlers, '{}')
                                                     || only_handlers)
                               ORDER BY 1) END
         WHERE w.state <> 'gone'
           AND (target_worker IS NULL OR w.id = target_worker)
           AND (target_host IS NULL OR w.host = target_host)
        RETURNING w.id, w.host, w.pid, w.state
    )
    SELECT c.id, c.host, c.pid, c.state FROM changed c;
    IF FOUND THEN
        PERFORM pg_notify(@schema_literal@ || '.wake', '{"registry": "drain"}');
    END IF;
END;
$$;

-- Undo drains (plain and hand-back) on live daemons: one id, one host, or all. Returns the
-- daemons changed. Jobs whose grace is still running stay where they are.
CREATE FUNCTION @schema@.drain_lift(target_worker text, target_host text)
RETURNS TABLE (id text, host text, pid integer, state text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF target_worker IS NOT NULL AND target_host IS NOT NULL THEN
        RAISE EXCEPTION 'pgworkerd: give a daemon id or a host, not both'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH changed AS (
        UPDATE @schema@.workers w
           SET drain_requested = false, hand_back_requested_at = NULL, hand_back_grace = NULL,
               hand_back_queues = NULL, hand_back_handlers = NULL
         WHERE w.state <> 'gone'
           AND (target_worker IS NULL OR w.id = target_worker)
           AND (target_host IS NULL OR w.host = target_host)
        RETURNING w.id, w.host, w.pid, w.state
    )
    SELECT c.id, c.host, c.pid, c.state FROM changed c;
    IF FOUND THEN
        PERFORM pg_notify(@schema_literal@ || '.wake', '{"registry": "drain"}');
    END IF;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.drain_request(text, text, boolean, interval, text[], text[]),
                           @schema@.drain_lift(text, text)
    FROM PUBLIC;

-- The other-language path (0019): the stable claim, claim_jobs, over claim_v3; the
-- finishing functions above became durable in place (see the migration's header).

-- claim_jobs: the stable claim, for the daemon (queries.sql job_claim) and for workers in
-- any language (README "Jobs"). Named, documented arguments, each checked (a bad one
-- raises 22023 naming it, and claims nothing); then claim_v3's one implementation:
-- queues and handlers paused by `pgworkerd pause` are left out, fleet-wide limits and
-- per-key limits hold (as given by the caller: each claim applies its own caller's
-- limits, see claim_v3), expired leases are rescued, a drained worker claims nothing.
-- Its commit is durable whatever the server's synchronous_commit (see the 0019 header).
--   SELECT * FROM pgworkerd.claim_jobs(
--       worker => 'worker-1', queues => '{default,mail}', handlers => '{send_mail,export}',
--       lease_seconds => '{300,60}', free_slots => '{4,2}', max_jobs => 6,
--       max_running => '{NULL,10}', max_running_per_key => '{NULL,2}');
-- The per-handler arguments are arrays in the order of `handlers`, one element each.
CREATE FUNCTION @schema@.claim_jobs(
    worker text,                -- this worker's name; the finishing functions take it back
    queues text[],              -- the queues to claim from
    handlers text[],            -- the handlers this worker runs, each named once
    lease_seconds float8[],     -- per handler: the lease a claimed job gets (0 < s <= 100 y)
    free_slots integer[],       -- per handler: how many more jobs it may take now (>= 0)
    max_jobs integer,           -- at most this many jobs in all (>= 0)
    handler_max_attempts integer[] DEFAULT NULL,  -- per handler: overrides the job's own
    -- per handler: a JSON array of the queues (among `queues`) it claims from, or null for
    -- all of them; the whole argument NULL: every handler claims from all of them
    handler_queues jsonb DEFAULT NULL,
    max_running integer[] DEFAULT NULL,           -- per handler: fleet-wide, or NULL
    max_running_per_key integer[] DEFAULT NULL    -- per handler: per concurrency key, or NULL
)
RETURNS TABLE (
    id bigint, queue text, handler text, payload jsonb, priority integer, attempts integer,
    max_attempts integer, lease_token bigint, checkpoint jsonb, run_at timestamptz,
    created_at timestamptz, locked_until timestamptz, rescued boolean
)
LANGUAGE plpgsql
-- SECURITY INVOKER, like claim_v3: the caller needs pgworkerd_daemon's rights.
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    n integer := coalesce(cardinality(claim_jobs.handlers), 0);
    duplicated boolean := false;
    problem text;
BEGIN
    -- The checks are plain expressions (no subquery, so PL/pgSQL evaluates them without
    -- the executor: they cost the daemon's claims next to nothing), bar this one, which
    -- only a claim for several handlers needs.
    IF n > 1 THEN
        duplicated := (SELECT count(DISTINCT h) FROM unnest(claim_jobs.handlers) h) <> n;
    END IF;
    problem := CASE
        WHEN claim_jobs.worker IS NULL OR claim_jobs.worker = '' THEN
            'worker must name this worker (the finishing functions take the name back), not '
            || coalesce(quote_literal(claim_jobs.worker), 'NULL')
        WHEN claim_jobs.queues IS NULL OR array_ndims(claim_jobs.queues) > 1
             OR array_position(claim_jobs.queues, NULL) IS NOT NULL THEN
            'queues must be an array of queue names without NULL, not '
            || coalesce(left(claim_jobs.queues::text, 200), 'NULL')
        WHEN claim_jobs.handlers IS NULL OR array_ndims(claim_jobs.handlers) > 1
             OR array_position(claim_jobs.handlers, NULL) IS NOT NULL
             OR array_position(claim_jobs.handlers, '') IS NOT NULL OR duplicated THEN
            'handlers must be an array of handler names, each named once, without NULL or '
            || 'empty names, not '
            || coalesce(left(claim_jobs.handlers::text, 200), 'NULL')
        WHEN claim_jobs.lease_seconds IS NULL OR array_ndims(claim_jobs.lease_seconds) > 1
             OR cardinality(claim_jobs.lease_seconds) <> n
             -- NaN is above every number: refused by the second test
             OR (0 < ALL(claim_jobs.lease_seconds)
                 AND 3153600000 >= ALL(claim_jobs.lease_seconds)) IS NOT TRUE THEN
            'lease_seconds must give each handler its lease in seconds (above 0, at most '
            || '100 years), one per handler in the order of handlers, not '
            || coalesce(left(claim_jobs.lease_seconds::text, 200), 'NULL')
        WHEN claim_jobs.free_slots IS NULL OR array_ndims(claim_jobs.free_slots) > 1
             OR cardinality(claim_jobs.free_slots) <> n
             OR (0 <= ALL(claim_jobs.free_slots)) IS NOT TRUE THEN
            'free_slots must give each handler how many more jobs it may take (0 or more), '
            || 'one per handler in the order of handlers, not '
            || coalesce(left(claim_jobs.free_slots::text, 200), 'NULL')
        WHEN claim_jobs.max_jobs IS NULL OR claim_jobs.max_jobs < 0 THEN
            'max_jobs must be 0 or more, not ' || coalesce(claim_jobs.max_jobs::text, 'NULL')
        WHEN claim_jobs.handler_max_attempts IS NOT NULL
             AND (array_ndims(claim_jobs.handler_max_attempts) > 1
                  OR cardinality(claim_jobs.handler_max_attempts) <> n
                  OR (1 > ANY(claim_jobs.handler_max_attempts)) IS TRUE) THEN
            'handler_max_attempts must be NULL, or one per handler in the order of handlers, '
            || 'each NULL (the job''s own) or at least 1, not '
            || left(claim_jobs.handler_max_attempts::text, 200)
        WHEN claim_jobs.handler_queues IS NOT NULL
             AND (jsonb_typeof(claim_jobs.handler_queues) <> 'array'
                  OR jsonb_array_length(claim_jobs.handler_queues) <> n
                  -- strict: lax mode would look into the inner arrays as well
                  OR jsonb_path_exists(claim_jobs.handler_queues,
                                       'strict $[*] ? (@.type() != "null" && @.type() != "array")')
                  OR jsonb_path_exists(claim_jobs.handler_queues,
                                       'strict $[*] ? (@.type() == "array")[*] ? (@.type() != "string")'))
             THEN
            'handler_queues must be NULL, or a JSON array with one element per handler in the '
            || 'order of handlers, each null (all of queues) or an array of queue names, not '
            || left(claim_jobs.handler_queues::text, 200)
        WHEN claim_jobs.max_running IS NOT NULL
             AND (array_ndims(claim_jobs.max_running) > 1
                  OR cardinality(claim_jobs.max_running) <> n
                  OR (1 > ANY(claim_jobs.max_running)) IS TRUE) THEN
            'max_running must be NULL, or one per handler in the order of handlers, each '
            || 'NULL (no limit) or at least 1, not ' || left(claim_jobs.max_running::text, 200)
        WHEN claim_jobs.max_running_per_key IS NOT NULL
             AND (array_ndims(claim_jobs.max_running_per_key) > 1
                  OR cardinality(claim_jobs.max_running_per_key) <> n
                  OR (1 > ANY(claim_jobs.max_running_per_key)) IS TRUE) THEN
            'max_running_per_key must be NULL, or one per handler in the order of handlers, '
            || 'each NULL (no limit) or at least 1, not '
            || left(claim_jobs.max_running_per_key::text, 200)
    END;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgworkerd: claim_jobs: %', problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A durable commit (see the 0019 header: SET LOCAL here, never a SET clause).
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    RETURN QUERY
    SELECT * FROM @schema@.claim_v3(
        claim_jobs.worker, claim_jobs.queues, claim_jobs.handlers, claim_jobs.lease_seconds,
        claim_jobs.free_slots, claim_jobs.max_jobs, claim_jobs.handler_max_attempts,
        claim_jobs.handler_queues, claim_jobs.max_running, claim_jobs.max_running_per_key);
END;
$$;

-- Who still calls each claim (a contract migration drops the old ones once no supported
-- release calls them).
COMMENT ON FUNCTION @schema@.claim_jobs(text, text[], text[], float8[], integer[], integer,
                                        integer[], jsonb, integer[], integer[]) IS
    'The stable claim (schema 19) for the daemon and for workers in any language: pauses, '
    'fleet-wide and per-key limits, rescues, a durable commit. README "Jobs".';
COMMENT ON FUNCTION @schema@.claim_v3(text, text[], text[], float8[], integer[], integer,
                                      integer[], jsonb, integer[], integer[]) IS
    'The implementation behind claim_jobs. Called directly only by daemons built from '
    'schemas 9 to 18 (unreleased code before schema 19), during a rolling upgrade. New '
    'code calls claim_jobs (checked arguments, a durable commit).';
COMMENT ON FUNCTION @schema@.claim_v2(text, text[], text[], float8[], integer[], integer,
                                      integer[], jsonb) IS
    'Superseded; called by no release, only by unreleased daemons of schemas 6 to 8. It '
    'ignores pauses and fleet-wide limits. New code calls claim_jobs.';
COMMENT ON FUNCTION @schema@.claim(text, text[], text[], float8[], integer[], integer,
                                   integer[]) IS
    'Superseded; kept for release 0.2 daemons (schema 5) and SQL workers written against '
    'its README, during a rolling upgrade. It ignores pauses, fleet-wide limits and '
    'concurrency keys, and does not force a durable commit. New code calls claim_jobs.';

-- Upkeep (0020): finished jobs by status for retention, and the retention of schedule
-- runs and gone daemons (prune_finished_v2).
--
-- An expand migration (README "Upgrading"): three new indexes and one new function; nothing
-- existing changes, so older daemons run on (calling prune_finished_v1, which keeps
-- working and takes the same lock as v2, so old and new daemons never prune at once).
-- (`retry` resetting the snooze count is a change of the statement in queries.sql.)
--
-- Finished jobs of each final status by finish time, for retention. With the default
-- mixed retentions (completed 7 days, dead 30 days) the dead jobs between 7 and 30 days
-- old are kept, and they finished before the completed jobs that have just turned 7 days
-- old. Through jobs_finished_at_idx (oldest first, the status checked row by row) every
-- batch of completed jobs read all those kept dead jobs first, each batch again
-- (bench/retention_cost.py). A partial index per status holds only that status's rows,
-- so a batch reads the rows it deletes and stops. (One index on (status, finished_at)
-- does not do: the planner prefers jobs_finished_at_idx, whose order follows the heap's,
-- and so walks the kept rows all the same.) Each finished row version is in one of them
-- (a pending or running job is in none): together they cost about one index.
-- On a large table build them beforehand without blocking writes, e.g.
--     CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_completed_finished_at_idx
--         ON pgworkerd.jobs (finished_at) WHERE status = 'completed';
-- (and so for cancelled and dead), then migrate: IF NOT EXISTS skips what is there.
CREATE INDEX IF NOT EXISTS jobs_completed_finished_at_idx ON @schema@.jobs (finished_at)
    WHERE status = 'completed';
CREATE INDEX IF NOT EXISTS jobs_cancelled_finished_at_idx ON @schema@.jobs (finished_at)
    WHERE status = 'cancelled';
CREATE INDEX IF NOT EXISTS jobs_dead_finished_at_idx ON @schema@.jobs (finished_at)
    WHERE status = 'dead';

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
CREATE FUNCTION @schema@.prune_finished_v2(
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
                    ORDER BY finished_at
                    LIMIT p_batch - deleted
                    FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS n = ROW_COUNT;
        deleted := deleted + n;
    END IF;

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

REVOKE EXECUTE ON FUNCTION @schema@.prune_finished_v2(float8, float8, float8, float8, float8,
                                                      integer) FROM PUBLIC;

-- Silent daemons (0021, silent): the heartbeat interval each daemon keeps, and the one
-- definition of a silent daemon.

-- The longest a daemon lets pass between two registry heartbeats, as it promised at its
-- latest one: 5 s while it holds running jobs, 10 s while idle (daemon/presence.py).
-- Bounded: an interval of a day would hide a dead daemon for two, one of 0 flag a live one.
ALTER TABLE @schema@.workers
    ADD COLUMN heartbeat_interval interval NOT NULL DEFAULT '10 seconds'
    CONSTRAINT workers_heartbeat_interval_check
    CHECK (heartbeat_interval >= interval '1 second' AND heartbeat_interval <= interval '1 hour');

-- The one definition of a silent daemon, used by `explain`, `status`, `show`, the
-- dashboard and the metric: its registry heartbeat is older than twice the interval it
-- promised (one heartbeat missed, and as long again for a loaded host or database).
-- Killed, frozen, or cut off from the database: nobody can tell which from here, so
-- nothing acts on it (a cut-off host's child runs on until its lease ends).
-- A SQL-standard body that PostgreSQL inlines into the calling statement (a function
-- with SET search_path is called row by row: 19 ms for 1,000 registry rows), its names
-- bound now, as the pinned search_path of the other functions would bind them.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
CREATE FUNCTION @schema@.daemon_silent(w @schema@.workers)
RETURNS boolean
LANGUAGE sql
STABLE
PARALLEL SAFE
RETURN w.heartbeat_at < now() - 2 * w.heartbeat_interval;

-- Roles for people (0018).

-- Who enqueued a job: the role the session logged in as, so that an enqueuer, which may not
-- read the jobs table, can read and wait for its own jobs (job_get_v1) and no one else's.
-- session_user, not current_user: the enqueue functions are SECURITY DEFINER, so inside
-- them current_user is the schema's owner, while session_user stays the login (SET ROLE
-- changes neither it nor what job_get_v1 compares it with). A column default: no change to
-- the enqueue functions, and nothing measurable per insert
-- (bench/people_roles_bench.py: within 4 %, the noise of a shared 2-CPU VM). The column is
-- added first and its default set after, so the jobs already there keep NULL (enqueued
-- before anyone recorded it: no enqueuer reads them) instead of the migrating role's
-- name, and the table is not rewritten.
ALTER TABLE @schema@.jobs ADD COLUMN enqueued_by text;
ALTER TABLE @schema@.jobs ALTER COLUMN enqueued_by SET DEFAULT session_user;

-- One job as pgworkerd.get returns it (client.JobInfo's fields, in order), for a role that
-- may read it: the login that enqueued it (enqueued_by = session_user), or one that may
-- SELECT the jobs table (the daemon, operator and reader roles, the owner). Anyone else
-- gets no row, as for an id that does not exist: it learns nothing of other roles' jobs.
-- SECURITY DEFINER so that the enqueuer needs no right on the table; STABLE, one index
-- lookup by primary key: `pgworkerd.wait` calls it on every notification and poll.
-- PL/pgSQL rather than SQL: it keeps its plan for the session, where a SECURITY DEFINER
-- SQL function is planned on every call (twice the time, bench/people_roles_bench.py).
-- EXECUTE stays with PUBLIC (unlike the other SECURITY DEFINER functions): its predicate is
-- the check, so it shows no role more than that role may read anyway, and every role that
-- read jobs with pgworkerd.get before (SELECT on the table: the daemon role, an
-- application's own role) keeps doing so after the upgrade, before roles.sql runs again.
-- Calling it still needs USAGE on the schema.
CREATE FUNCTION @schema@.job_get_v1(job_id bigint)
RETURNS TABLE (id bigint, queue text, handler text, status text, priority integer,
               attempts integer, max_attempts integer, snoozes integer, result jsonb,
               progress jsonb, last_error text, cancel_requested boolean,
               run_at timestamptz, created_at timestamptz, started_at timestamptz,
               finished_at timestamptz)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT j.id, j.queue, j.handler, j.status::text, j.priority, j.attempts,
           j.max_attempts, j.snoozes, j.result, j.progress, j.last_error,
           j.cancel_requested, j.run_at, j.created_at, j.started_at, j.finished_at
      FROM @schema@.jobs j
     WHERE j.id = job_get_v1.job_id
       AND (j.enqueued_by = session_user
            OR has_any_column_privilege(session_user, '@schema@.jobs', 'SELECT'));
END;
$$;

-- The daemon role's fenced functions, schedules fired from their stored definition, the
-- retention floor (0022).
-- The fenced functions the daemon role changes jobs through. SECURITY DEFINER, so the
-- daemon role needs no UPDATE on jobs (roles.sql takes it away): every change of status,
-- attempts, checkpoint or result is one of these, each fenced by the lease (the job's
-- worker and token, and status running), and EXECUTE is revoked from PUBLIC (roles.sql
-- grants it to pgworkerd_daemon). Each forces a durable commit (synchronous_commit on
-- for the transaction) and finds jobs by primary key, as the statements of 0019 did.
--
-- The claim of every language (0019) and the finishing functions of other languages'
-- workers keep their names and arguments; they run as the schema owner from now on.
ALTER FUNCTION @schema@.claim_jobs(text, text[], text[], float8[], integer[], integer,
                                   integer[], jsonb, integer[], integer[])
    SECURITY DEFINER;
ALTER FUNCTION @schema@.renew_lease(bigint, text, bigint, float8, jsonb, jsonb)
    SECURITY DEFINER;
ALTER FUNCTION @schema@.complete_job(bigint, text, bigint, jsonb, jsonb) SECURITY DEFINER;
ALTER FUNCTION @schema@.fail_job(bigint, text, bigint, text, float8, float8, jsonb, jsonb)
    SECURITY DEFINER;
ALTER FUNCTION @schema@.release_job(bigint, text, bigint, jsonb, jsonb) SECURITY DEFINER;
ALTER FUNCTION @schema@.snooze_job(bigint, text, bigint, float8, integer, jsonb, jsonb)
    SECURITY DEFINER;
ALTER FUNCTION @schema@.give_up_job(bigint, text, bigint, text) SECURITY DEFINER;
REVOKE EXECUTE ON FUNCTION
    @schema@.claim_jobs(text, text[], text[], float8[], integer[], integer, integer[], jsonb,
                        integer[], integer[]),
    @schema@.renew_lease(bigint, text, bigint, float8, jsonb, jsonb),
    @schema@.complete_job(bigint, text, bigint, jsonb, jsonb),
    @schema@.fail_job(bigint, text, bigint, text, float8, float8, jsonb, jsonb),
    @schema@.release_job(bigint, text, bigint, jsonb, jsonb),
    @schema@.snooze_job(bigint, text, bigint, float8, integer, jsonb, jsonb),
    @schema@.give_up_job(bigint, text, bigint, text)
    FROM PUBLIC;

-- Many leases of one worker at once (the daemon's job_renew): each renewed with its
-- progress and checkpoint (NULL keeps the old value), or reported lost. Primary-key
-- look-ups only (id = ANY), the status compared as text (0019).
CREATE FUNCTION @schema@.renew_leases(
    worker text, ids bigint[], tokens bigint[], lease_seconds float8[], progress jsonb[],
    checkpoints jsonb[])
RETURNS TABLE (id bigint, renewed boolean, cancel_requested boolean,
               locked_until timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    RETURN QUERY
    WITH lease AS (
        SELECT * FROM unnest(renew_leases.ids, renew_leases.tokens,
                             renew_leases.lease_seconds, renew_leases.progress,
                             renew_leases.checkpoints)
                 AS l(id, token, lease_seconds, progress, checkpoint)
    ), renewed AS (
        UPDATE @schema@.jobs j
           SET locked_until = now() + make_interval(secs => l.lease_seconds),
               progress = coalesce(l.progress, j.progress),
               checkpoint = coalesce(l.checkpoint, j.checkpoint),
               updated_at = now()
          FROM lease l
         WHERE j.id = ANY(renew_leases.ids) AND j.id = l.id AND j.lease_token = l.token
           AND j.locked_by = renew_leases.worker AND j.status::text = 'running'
        RETURNING j.id, j.cancel_requested, j.locked_until
    )
    SELECT l.id, r.id IS NOT NULL, coalesce(r.cancel_requested, false), r.locked_until
      FROM lease l LEFT JOIN renewed r ON r.id = l.id;
END;
$$;

-- Finish jobs their holder still owns (the daemon's job_complete): completed, each with
-- an optional result; returns the ids completed (a missing one lost its lease).
CREATE FUNCTION @schema@.complete_jobs(
    worker text, ids bigint[], tokens bigint[], results jsonb[], progress jsonb[])
RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    RETURN QUERY
    WITH done AS (
        SELECT * FROM unnest(complete_jobs.ids, complete_jobs.tokens, complete_jobs.results,
                             complete_jobs.progress) AS d(id, token, result, progress)
    )
    UPDATE @schema@.jobs j
       SET status = 'completed', result = d.result,
           progress = coalesce(d.progress, j.progress),
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           finished_at = now(), updated_at = now()
      FROM done d
     WHERE j.id = ANY(complete_jobs.ids) AND j.id = d.id AND j.locked_by = complete_jobs.worker
       AND j.lease_token = d.token AND j.status::text = 'running'
    RETURNING j.id;
END;
$$;

-- The holder stopped a job whose cancellation was requested (the daemon's
-- job_cancel_running): cancelled, with the reason and its latest progress (NULL keeps
-- the old value). Returns 'cancelled', or NULL when the lease was lost.
CREATE FUNCTION @schema@.cancel_held_job(
    job_id bigint, worker text, token bigint, reason text, progress jsonb DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    new_status text;
BEGIN
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    UPDATE @schema@.jobs j
       SET status = 'cancelled', last_error = cancel_held_job.reason,
           progress = coalesce(cancel_held_job.progress, j.progress),
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           finished_at = now(), updated_at = now()
     WHERE j.id = cancel_held_job.job_id AND j.locked_by = cancel_held_job.worker
       AND j.lease_token = cancel_held_job.token AND j.status::text = 'running'
    RETURNING j.status::text INTO new_status;
    RETURN new_status;
END;
$$;

-- The handler snoozed a held job (the daemon's job_snooze): pending again in
-- delay_seconds with the attempt not counted and one more snooze counted (cancelled if a
-- cancel was requested meanwhile). Unlike snooze_job (other languages' workers), no row
-- when the job has snoozed max_snoozes times already: the daemon then records a failed
-- attempt itself. No row either when the lease was lost.
CREATE FUNCTION @schema@.snooze_held_job(
    job_id bigint, worker text, token bigint, delay_seconds float8, max_snoozes integer,
    progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS TABLE (status text, run_at timestamptz, snoozes integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    -- (NaN is above every number in PostgreSQL: refused too)
    IF snooze_held_job.delay_seconds IS NULL
       OR NOT (snooze_held_job.delay_seconds BETWEEN 0 AND 2592000) THEN
        RAISE EXCEPTION 'pgworkerd: a snooze must be from 0 to 2592000 seconds (30 days), not %',
            coalesce(snooze_held_job.delay_seconds::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    UPDATE @schema@.jobs j
       SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                         ELSE 'pending' END::@schema@.job_status,
           run_at = CASE WHEN j.cancel_requested THEN j.run_at
                         ELSE now() + make_interval(secs => snooze_held_job.delay_seconds) END,
           finished_at = CASE WHEN j.cancel_requested THEN now() END,
           attempts = j.attempts - 1,
           snoozes = j.snoozes + 1,
           progress = coalesce(snooze_held_job.progress, j.progress),
           checkpoint = coalesce(snooze_held_job.checkpoint, j.checkpoint),
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           updated_at = now()
     WHERE j.id = snooze_held_job.job_id AND j.locked_by = snooze_held_job.worker
       AND j.lease_token = snooze_held_job.token AND j.status::text = 'running'
       AND j.snoozes < snooze_held_job.max_snoozes
    RETURNING j.status::text, j.run_at, j.snoozes;
END;
$$;

-- Captured output (the daemon's job_log_write; 0015), written only for attempts the
-- calling worker holds or held: the job is running under that worker and token, or the
-- attempt history (0012, written by a trigger) names that worker for that token (the
-- last write after the attempt ended). A log row another worker wrote is never changed.
-- A NULL (or empty) head keeps the stored one. Returns the job ids written.
CREATE FUNCTION @schema@.job_log_write_v1(
    worker text, ids bigint[], tokens bigint[], attempts integer[], heads text[],
    tails text[], totals bigint[], omitted bigint[], finished boolean[])
RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    INSERT INTO @schema@.job_logs AS l
           (job_id, lease_token, attempt, worker, head, tail, total_bytes, omitted_bytes,
            finished, updated_at)
    SELECT u.id, u.token, u.attempt, job_log_write_v1.worker, coalesce(u.head, ''), u.tail,
           u.total, u.omitted, u.finished, now()
      FROM unnest(job_log_write_v1.ids, job_log_write_v1.tokens, job_log_write_v1.attempts,
                  job_log_write_v1.heads, job_log_write_v1.tails, job_log_write_v1.totals,
                  job_log_write_v1.omitted, job_log_write_v1.finished)
           AS u(id, token, attempt, head, tail, total, omitted, finished)
     WHERE EXISTS (SELECT 1 FROM @schema@.jobs j
                    WHERE j.id = u.id AND j.lease_token = u.token
                      AND j.locked_by = job_log_write_v1.worker
                      AND j.status::text = 'running')
        OR EXISTS (SELECT 1 FROM @schema@.attempts a
                    WHERE a.job_id = u.id AND a.lease_token = u.token
                      AND a.worker = job_log_write_v1.worker)
    ON CONFLICT (job_id, lease_token) DO UPDATE
       SET head = CASE WHEN EXCLUDED.head = '' THEN l.head ELSE EXCLUDED.head END,
           tail = EXCLUDED.tail, total_bytes = EXCLUDED.total_bytes,
           omitted_bytes = EXCLUDED.omitted_bytes, finished = EXCLUDED.finished,
           updated_at = EXCLUDED.updated_at
     WHERE l.worker = EXCLUDED.worker
    RETURNING l.job_id;
END;
$$;

-- What the daemon measured of its own attempts (the daemon's attempt_account; 0012):
-- only rows naming the calling worker and the attempt's token. Returns the rows changed.
CREATE FUNCTION @schema@.attempt_account_v1(
    worker text, ids bigint[], tokens bigint[], wall float8[], cpu_user float8[],
    cpu_system float8[], peak_memory bigint[])
RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE @schema@.attempts a
       SET wall_seconds = u.wall, cpu_user_seconds = u.cpu_user,
           cpu_system_seconds = u.cpu_system, peak_memory = u.peak_memory
      FROM unnest(attempt_account_v1.ids, attempt_account_v1.tokens, attempt_account_v1.wall,
                  attempt_account_v1.cpu_user, attempt_account_v1.cpu_system,
                  attempt_account_v1.peak_memory)
           AS u(id, token, wall, cpu_user, cpu_system, peak_memory)
     WHERE a.job_id = ANY(attempt_account_v1.ids)  -- by primary key, whatever the plan expects
       AND a.job_id = u.id AND a.lease_token = u.token AND a.worker = attempt_account_v1.worker
    RETURNING a.job_id;
END;
$$;

REVOKE EXECUTE ON FUNCTION
    @schema@.renew_leases(text, bigint[], bigint[], float8[], jsonb[], jsonb[]),
    @schema@.complete_jobs(text, bigint[], bigint[], jsonb[], jsonb[]),
    @schema@.cancel_held_job(bigint, text, bigint, text, jsonb),
    @schema@.snooze_held_job(bigint, text, bigint, float8, integer, jsonb, jsonb),
    @schema@.job_log_write_v1(text, bigint[], bigint[], integer[], text[], text[], bigint[],
                              bigint[], boolean[]),
    @schema@.attempt_account_v1(text, bigint[], bigint[], float8[], float8[], float8[],
                                bigint[])
    FROM PUBLIC;

-- Schedules: whether a cron expression (5 fields, or 6 with seconds first, as cronsim
-- reads them: numbers, names, *, ?, ranges, steps, lists; Sunday 0 or 7) produces the
-- instant `at` in time zone `zone`. A field using cronsim's L, W or # is not checked here
-- (it matches every value): such a schedule's ticks are held to the other fields and to
-- schedule_fire_v2's window only. In a zone's spring-forward gap cronsim fires a skipped
-- wall time when the clocks jump: at a jump, the hour before counts, any minute. A wall
-- time repeated when the clocks go back matches at both instants (cronsim fires the
-- first only).
CREATE FUNCTION @schema@.cron_field_matches(field text, value integer, low integer,
                                            high integer, names text[])
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    item text;
    parts text[];
    bounds text[];
    step integer;
    lo integer;
    hi integer;
BEGIN
    IF field ~* '[LW#]' THEN
        RETURN true;
    END IF;
    FOREACH item IN ARRAY string_to_array(upper(field), ',') LOOP
        parts := string_to_array(item, '/');
        step := coalesce(parts[2]::integer, 1);
        IF parts[1] IN ('*', '?') THEN
            lo := low;
            hi := high;
        ELSE
            bounds := string_to_array(parts[1], '-');
            lo := coalesce(array_position(names, bounds[1]) - 1 + low, bounds[1]::integer);
            hi := CASE WHEN cardinality(bounds) > 1
                       THEN coalesce(array_position(names, bounds[2]) - 1 + low,
                                     bounds[2]::integer)
                       WHEN parts[2] IS NOT NULL THEN high
                       ELSE lo END;
        END IF;
        IF step > 0 AND value BETWEEN lo AND hi AND (value - lo) % step = 0 THEN
            RETURN true;
        END IF;
    END LOOP;
    RETURN false;
END;
$$;

-- Whether wall time `wall` matches the six fields (seconds first); any_minute: the
-- seconds and minutes fields are not checked (a wall time in a skipped hour).
CREATE FUNCTION @schema@.cron_wall_matches(fields text[], wall timestamp, any_minute boolean)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    months constant text[] := ARRAY['JAN', 'FEB', 'MAR', 'APR', 'MAY', 'JUN', 'JUL', 'AUG',
                                    'SEP', 'OCT', 'NOV', 'DEC'];
    days constant text[] := ARRAY['SUN', 'MON', 'TUE', 'WED', 'THU', 'FRI', 'SAT'];
    day_of_week integer := extract(dow FROM wall)::integer;
    dom_ok boolean;
    dow_ok boolean;
BEGIN
    dom_ok := @schema@.cron_field_matches(fields[4], extract(day FROM wall)::integer, 1, 31,
                                          NULL);
    dow_ok := @schema@.cron_field_matches(fields[6], day_of_week, 0, 7, days)
              OR (day_of_week = 0 AND @schema@.cron_field_matches(fields[6], 7, 0, 7, days));
    RETURN (any_minute OR (
                @schema@.cron_field_matches(fields[1], extract(second FROM wall)::integer,
                                            0, 59, NULL)
                AND @schema@.cron_field_matches(fields[2], extract(minute FROM wall)::integer,
                                                0, 59, NULL)))
       AND @schema@.cron_field_matches(fields[3], extract(hour FROM wall)::integer, 0, 23,
                                       NULL)
       AND @schema@.cron_field_matches(fields[5], extract(month FROM wall)::integer, 1, 12,
                                       months)
       AND CASE WHEN left(fields[4], 1) IN ('*', '?') OR left(fields[6], 1) IN ('*', '?')
                THEN dom_ok AND dow_ok
                ELSE dom_ok OR dow_ok END;
END;
$$;

CREATE FUNCTION @schema@.cron_matches(expression text, zone text, at timestamptz)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fields text[] := regexp_split_to_array(btrim(expression), '\s+');
    wall timestamp := at AT TIME ZONE zone;
BEGIN
    IF cardinality(fields) = 5 THEN
        fields := array_prepend('0', fields);
    ELSIF cardinality(fields) <> 6 THEN
        RETURN false;
    END IF;
    RETURN @schema@.cron_wall_matches(fields, wall, false)
        -- the clocks jumped forward at `at` (spring): the skipped wall times fire now
        OR ((at - interval '1 second') AT TIME ZONE zone + interval '1 second' < wall
            AND @schema@.cron_wall_matches(fields, date_trunc('hour', wall) - interval '1 hour',
                                           true));
END;
$$;

-- Schedules an operator declared, fired by name and tick, the job built from the stored
-- definition (0022: handler, payload, queue, priority, max_attempts; the overlap policy
-- too; schedule_declare is the operator's), only at a tick the
-- stored schedule produces: a whole second, on its `every` (multiples of it since the
-- epoch) or its cron expression; at most 60 s ahead of the server's clock (a host's clock
-- may run ahead); and not older than the schedule fires (within 120 s of now: a tick's
-- grace of at most 60 s, and 60 s of clock skew), except the catch-up of catch_up =
-- "last": the latest tick missed, when it is later than every tick handled of the
-- schedule. Each tick once (schedule_runs' key, 0010). The worker must be a live daemon of
-- the registry. A refused tick raises 22023 with the reason and creates nothing.
CREATE FUNCTION @schema@.schedule_fire_v2(
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
               'max_attempts', stored.definition -> 'max_attempts')) e
     WHERE jsonb_typeof(e.value) <> 'null';
    SELECT f.outcome, f.job_id INTO outcome, job_id
      FROM @schema@.schedule_fire(name, tick, job,
                                  coalesce(stored.definition ->> 'overlap', 'skip'), worker) f;
END;
$$;
REVOKE EXECUTE ON FUNCTION @schema@.schedule_fire_v2(text, timestamptz, text) FROM PUBLIC;

-- The shortest retention an operator allows the fleet's own pruning (one row). A caller
-- of prune_finished_v2 that may not DELETE jobs itself (the daemon role) is refused a
-- retention below it; one that may (the owner, pgworkerd_operator) is not held to it,
-- as it could delete the rows directly. 1 day until an operator changes it with
-- retention_floor_set (or an UPDATE of this row by a role allowed to).
CREATE TABLE @schema@.retention_floor (
    single boolean PRIMARY KEY DEFAULT true CHECK (single),
    min_seconds float8 NOT NULL
        CHECK (min_seconds >= 0 AND min_seconds <= 100 * 365.25 * 86400),
    set_by text NOT NULL DEFAULT session_user,
    set_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO @schema@.retention_floor (min_seconds, set_by) VALUES (86400, 'pgworkerd migrate');

-- Set the floor (seconds), recording who set it; returns the new floor.
CREATE FUNCTION @schema@.retention_floor_set(min_seconds float8)
RETURNS float8
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF min_seconds IS NULL OR NOT (min_seconds BETWEEN 0 AND 100 * 365.25 * 86400) THEN
        RAISE EXCEPTION 'pgworkerd: a retention floor must be from 0 to 100 years in '
                        'seconds, not %', coalesce(min_seconds::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE @schema@.retention_floor f
       SET min_seconds = retention_floor_set.min_seconds, set_by = session_user,
           set_at = now();
    RETURN min_seconds;
END;
$$;
REVOKE EXECUTE ON FUNCTION @schema@.retention_floor_set(float8) FROM PUBLIC;

-- Enqueue bounds (0023).

-- What an operator allows enqueuers: a priority range and namespaces for their keys, per
-- login role (or a role it is a member of) and per queue. Without a row an enqueuer
-- chooses any priority (-32768 is claimed before everything else due) and any dedupe or
-- concurrency key of any handler it names (README "Trust boundaries"). A row binds the
-- logins it names:
--   role_name  a role: that login, and every login that is a member of it (a superuser
--              only when named itself); NULL: every login;
--   queue      the jobs of that queue only; NULL: of every queue;
--   priority_min .. priority_max: the priorities those jobs may have (the default 0
--              included: a range that leaves out 0 refuses jobs that name no priority);
--   dedupe_key_prefix, concurrency_key_prefix: every such key of those jobs starts with
--              it; NULL: any key.
-- Every row that binds a job holds (several rows: the narrowest of each). The enqueue
-- functions check them (enqueue_bounds_check) before writing anything; deploy/roles.sql
-- lets pgworkerd_operator write the rows and pgworkerd_reader read them. The checks
-- refuse a row that could not work: an inverted or out-of-range priority range, an empty,
-- over-long or unprintable prefix, a queue name no job can have, a role that does not
-- exist (so a typo does not leave an application unbounded).
CREATE TABLE @schema@.enqueue_bounds (
    id                     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    role_name              text,
    queue                  text,
    priority_min           integer NOT NULL DEFAULT -32768,
    priority_max           integer NOT NULL DEFAULT 32767,
    dedupe_key_prefix      text,
    concurrency_key_prefix text,
    comment                text,
    set_by                 text NOT NULL DEFAULT session_user,
    set_at                 timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT enqueue_bounds_role_exists
        CHECK (role_name IS NULL OR pg_catalog.to_regrole(pg_catalog.quote_ident(role_name))
                                    IS NOT NULL),
    CONSTRAINT enqueue_bounds_queue_name CHECK (@schema@.enqueue_name_ok(queue)),
    CONSTRAINT enqueue_bounds_priority_range
        CHECK (priority_min BETWEEN -32768 AND 32767 AND priority_max BETWEEN -32768 AND 32767
               AND priority_min <= priority_max),
    CONSTRAINT enqueue_bounds_dedupe_key_prefix
        CHECK (char_length(dedupe_key_prefix) BETWEEN 1 AND 64
               AND dedupe_key_prefix !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]'),
    CONSTRAINT enqueue_bounds_concurrency_key_prefix
        CHECK (char_length(concurrency_key_prefix) BETWEEN 1 AND 64
               AND concurrency_key_prefix
                   !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]'),
    CONSTRAINT enqueue_bounds_comment CHECK (char_length(comment) <= 500)
);

-- One row per (role, queue), NULL for "every": an operator replaces a bound, never stacks
-- a second one by mistake.
CREATE UNIQUE INDEX enqueue_bounds_role_queue_idx
    ON @schema@.enqueue_bounds (coalesce(role_name, ''), coalesce(queue, ''));

-- Raises for the first job of `jobs` (enqueue_many's array, before its own checks) that
-- a bound on this login refuses (42501, naming the bound and what it allows); returns
-- when none does. The login is session_user (the enqueue functions are SECURITY DEFINER:
-- current_user is the owner; SET ROLE changes neither). Called by enqueue, enqueue_many
-- and enqueue_many_v2 (so enqueue_v2 and schedule_fire) only when the table has a row:
-- one statement reads the bounds that bind this login once and checks every job against
-- them. Values of the wrong type are left to the checks that follow.
CREATE FUNCTION @schema@.enqueue_bounds_check(jobs jsonb)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    broken record;
    scope text;
BEGIN
    -- One statement: the bounds that bind this login, read once (MATERIALIZED), then
    -- every job against them.
    WITH binding AS MATERIALIZED (
        SELECT b.* FROM @schema@.enqueue_bounds b
         WHERE b.role_name IS NULL
            OR b.role_name = session_user
            OR EXISTS (SELECT FROM pg_roles r
                        WHERE r.rolname = b.role_name
                          AND pg_has_role(session_user, r.oid, 'MEMBER')
                          -- a superuser "is a member" of every role: bound only when named
                          AND NOT (SELECT s.rolsuper FROM pg_roles s
                                    WHERE s.rolname = session_user))
    )
    SELECT t.n, v.priority, b.*,
           v.priority NOT BETWEEN b.priority_min AND b.priority_max AS bad_priority,
           NOT starts_with(v.dedupe_key, b.dedupe_key_prefix) AS bad_dedupe_key
      INTO broken
      FROM jsonb_array_elements(jobs) WITH ORDINALITY AS t(e, n)
     CROSS JOIN LATERAL (
         SELECT CASE WHEN jsonb_typeof(t.e->'queue') = 'string' THEN t.e->>'queue'
                     ELSE 'default' END AS queue,
                CASE WHEN jsonb_typeof(t.e->'priority') = 'number'
                     THEN (t.e->>'priority')::numeric ELSE 0 END AS priority,
                CASE WHEN jsonb_typeof(t.e->'dedupe_key') = 'string'
                     THEN t.e->>'dedupe_key' END AS dedupe_key,
                CASE WHEN jsonb_typeof(t.e->'concurrency_key') = 'string'
                     THEN t.e->>'concurrency_key' END AS concurrency_key) v
      JOIN binding b ON b.queue IS NULL OR b.queue = v.queue
     WHERE v.priority NOT BETWEEN b.priority_min AND b.priority_max
        OR NOT starts_with(v.dedupe_key, b.dedupe_key_prefix)
        OR NOT starts_with(v.concurrency_key, b.concurrency_key_prefix)
     ORDER BY t.n, b.id
     LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    scope := format('enqueue bound %s (%s, %s)', broken.id,
                    CASE WHEN broken.role_name IS NULL THEN 'every login'
                         ELSE 'role ' || quote_ident(broken.role_name) END,
                    CASE WHEN broken.queue IS NULL THEN 'every queue'
                         ELSE 'queue ' || quote_literal(broken.queue) END);
    -- the keys themselves are not repeated: a dedupe key may hold any character
    RAISE EXCEPTION 'pgworkerd: job % of %: %', broken.n, jsonb_array_length(jobs),
        CASE WHEN broken.bad_priority
             THEN format('priority %s is outside %s..%s, the priorities %s allows',
                         broken.priority, broken.priority_min, broken.priority_max, scope)
             WHEN broken.bad_dedupe_key
             THEN format('dedupe_key must start with %L (%s)', broken.dedupe_key_prefix, scope)
             ELSE format('concurrency_key must start with %L (%s)',
                         broken.concurrency_key_prefix, scope) END
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'An operator sets enqueue bounds in the enqueue_bounds table '
                     '(README "Trust boundaries").';
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.enqueue_bounds_check(jsonb) FROM PUBLIC;

-- The daemon role cannot touch other hosts' attempts (0024).

-- Lease tokens (the fence every renew and finish names) were a counter: who saw one
-- token knew the next. Every new token is drawn at random now, from the server's strong
-- random source (gen_random_uuid, pg_strong_random): 60 random bits, plus 2^60 so that
-- every new token is above every counter token of earlier releases. One trigger, whatever
-- statement claims (claim_jobs, the claims of older releases, a burial), so no claim text
-- changes. A token is never ordered: attempts and logs are ordered by time.
CREATE FUNCTION @schema@.lease_token_draw()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    LOOP
        -- the uuid's last 8 bytes: 62 random bits (the variant takes 2), 60 of them kept
        NEW.lease_token := (1::bigint << 60)
            | (('x' || encode(substr(uuid_send(gen_random_uuid()), 9, 8), 'hex'))::bit(64)::bigint
               & ((1::bigint << 60) - 1));
        EXIT WHEN NEW.lease_token <> OLD.lease_token;
    END LOOP;
    RETURN NEW;
END;
$$;

CREATE TRIGGER jobs_lease_token_drawn
    BEFORE UPDATE OF lease_token ON @schema@.jobs
    FOR EACH ROW
    WHEN (NEW.lease_token IS DISTINCT FROM OLD.lease_token)
    EXECUTE FUNCTION @schema@.lease_token_draw();

-- What a daemon whose outcome was refused checks (outcomes.py): the job's status and
-- holder, and whether its token is still the one the caller names, without the token
-- itself (roles.sql does not let the daemon role read tokens: it could end or renew
-- another host's attempt with one). No row: no such job.
CREATE FUNCTION @schema@.job_lease_state_v1(id bigint, token bigint)
RETURNS TABLE (status text, token_holds boolean, locked_by text)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT j.status::text, j.lease_token = job_lease_state_v1.token, j.locked_by
      FROM @schema@.jobs j
     WHERE j.id = job_lease_state_v1.id;
$$;
REVOKE EXECUTE ON FUNCTION @schema@.job_lease_state_v1(bigint, bigint) FROM PUBLIC;

-- The registry: each daemon writes its own row only. A daemon draws a secret when it
-- starts (at least 32 characters, never stored: its SHA-256 is) and names it in every
-- write of its row; an id registered with another secret is refused. The row records the
-- login that registered it (registered_by), and a login may keep at most
-- registry_cap.max_live_per_login rows not gone (100 until an operator changes it;
-- a login that may INSERT into workers itself is not held to it, as for the retention
-- floor): a
-- compromised host can still register that many daemons and keep them fresh, as any
-- daemon of its login, but no more (README "Who can do what").
ALTER TABLE @schema@.workers
    ADD COLUMN secret_sha256 bytea,
    ADD COLUMN registered_by text;

CREATE TABLE @schema@.registry_cap (
    single boolean PRIMARY KEY DEFAULT true CHECK (single),
    max_live_per_login integer NOT NULL CHECK (max_live_per_login BETWEEN 1 AND 100000),
    set_by text NOT NULL DEFAULT session_user,
    set_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO @schema@.registry_cap (max_live_per_login, set_by) VALUES (100, 'pgworkerd migrate');

-- The row of `id` if `secret` is its secret; raises 42501 (22023 for a malformed secret).
CREATE FUNCTION @schema@.worker_secret_digest(secret text)
RETURNS bytea
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF secret IS NULL OR length(secret) NOT BETWEEN 32 AND 256 THEN
        RAISE EXCEPTION 'pgworkerd: a daemon''s registry secret must be 32 to 256 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN sha256(convert_to(secret, 'UTF8'));
END;
$$;

-- What a daemon may write into its row, bounded (a compromised host writes its own row
-- only, but every peer and `status` reads it): names of 1 to 255 characters, at most
-- 10,000 queues, handlers and in-flight jobs, settings of at most 1 MB. Raises 22023.
CREATE FUNCTION @schema@.worker_row_check(host text, version text, queues text[],
                                          handlers text[], handler_settings jsonb,
                                          in_flight bigint[])
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF host IS NULL OR length(host) NOT BETWEEN 1 AND 255
       OR version IS NULL OR length(version) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'pgworkerd: a daemon''s host and version must be 1 to 255 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF coalesce(cardinality(queues), 0) > 10000 OR coalesce(cardinality(handlers), 0) > 10000
       OR coalesce(cardinality(in_flight), 0) > 10000
       OR EXISTS (SELECT 1 FROM unnest(queues || handlers) n
                   WHERE n IS NULL OR length(n) NOT BETWEEN 1 AND 255) THEN
        RAISE EXCEPTION 'pgworkerd: a daemon names at most 10,000 queues, handlers and '
                        'in-flight jobs, each name 1 to 255 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_column_size(handler_settings) > 1048576 THEN
        RAISE EXCEPTION 'pgworkerd: a daemon''s handler settings must be at most 1 MB'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;

-- Record a daemon (worker_register of queries.sql before schema 24), or record it again
-- after it was marked gone, under the secret it registered with. Returns the id.
CREATE FUNCTION @schema@.worker_register_v2(
    id text, secret text, host text, pid integer, version text, queues text[],
    handlers text[], slots integer, state text, handler_settings jsonb,
    heartbeat_interval float8)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    digest bytea := @schema@.worker_secret_digest(secret);
    existing @schema@.workers;
    cap integer;
    live integer;
BEGIN
    IF id IS NULL OR id = '' OR length(id) > 255 THEN
        RAISE EXCEPTION 'pgworkerd: a daemon id must be 1 to 255 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @schema@.worker_row_check(host, version, queues, handlers, handler_settings,
                                      NULL);
    SELECT * INTO existing FROM @schema@.workers w WHERE w.id = worker_register_v2.id
       FOR UPDATE;
    IF FOUND AND existing.secret_sha256 IS DISTINCT FROM digest THEN
        RAISE EXCEPTION 'pgworkerd: daemon id % is registered already, with another secret',
            quote_literal(id)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Each daemon registers an id of its own (host:pid:random).';
    END IF;
    -- (a caller that may INSERT rows itself, the owner, is not held to the cap)
    IF (NOT FOUND OR existing.state = 'gone')
       AND NOT has_table_privilege(session_user, '@schema@.workers', 'INSERT') THEN
        -- one registration of a login at a time, so that the count holds
        PERFORM pg_advisory_xact_lock(
            hashtextextended('pgworkerd.registry.cap:' || @schema_literal@ || ':'
                             || session_user, 0));
        SELECT c.max_live_per_login INTO cap FROM @schema@.registry_cap c;
        SELECT count(*) INTO live FROM @schema@.workers w
         WHERE w.registered_by = session_user AND w.state <> 'gone';
        IF live >= cap THEN
            RAISE EXCEPTION 'pgworkerd: login % has % daemons registered and not gone, the '
                            'most the registry allows one login', quote_ident(session_user),
                            live
                USING ERRCODE = 'configuration_limit_exceeded',
                      HINT = 'An operator raises the cap: UPDATE ' || @schema_literal@
                             || '.registry_cap SET max_live_per_login = N.';
        END IF;
    END IF;
    INSERT INTO @schema@.workers AS w (id, host, pid, version, queues, handlers, slots, state,
                                       handler_settings, heartbeat_interval, secret_sha256,
                                       registered_by)
    VALUES (id, host, pid, version, queues, handlers, slots, state, handler_settings,
            make_interval(secs => heartbeat_interval), digest, session_user)
    ON CONFLICT ON CONSTRAINT workers_pkey DO UPDATE
       SET state = excluded.state, queues = excluded.queues, handlers = excluded.handlers,
           slots = excluded.slots, handler_settings = excluded.handler_settings,
           heartbeat_interval = excluded.heartbeat_interval,
           heartbeat_at = now(), stopped_at = NULL;
    PERFORM pg_notify(@schema_literal@ || '.wake', CASE
        WHEN octet_length(array_to_string(queues, ',') || array_to_string(handlers, ','))
             < 6000
        THEN json_build_object('peer', 'up', 'id', id, 'queues', queues,
                               'handlers', handlers, 'slots', slots)
        ELSE json_build_object('peer', 'up', 'id', id) END::text);
    RETURN id;
END;
$$;

-- A heartbeat (worker_heartbeat before schema 24) of the caller's own row: its state,
-- in-flight jobs and settings, heartbeat_at set to the server's now(). No row: the row is
-- gone (or the secret is not its own): register again.
CREATE FUNCTION @schema@.worker_heartbeat_v2(
    id text, secret text, state text, in_flight bigint[], queues text[], handlers text[],
    slots integer, handler_settings jsonb, heartbeat_interval float8)
RETURNS TABLE (drain_requested boolean, hand_back_requested_at timestamptz,
               hand_back_grace float8, hand_back_queues text[], hand_back_handlers text[])
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF worker_heartbeat_v2.state = 'gone' THEN
        RAISE EXCEPTION 'pgworkerd: a heartbeat cannot mark a daemon gone (deregister does)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @schema@.worker_row_check(
        'h', 'v', worker_heartbeat_v2.queues, worker_heartbeat_v2.handlers,
        worker_heartbeat_v2.handler_settings, worker_heartbeat_v2.in_flight);
    RETURN QUERY
    UPDATE @schema@.workers w
       SET state = worker_heartbeat_v2.state, in_flight = worker_heartbeat_v2.in_flight,
           queues = worker_heartbeat_v2.queues, handlers = worker_heartbeat_v2.handlers,
           slots = worker_heartbeat_v2.slots,
           handler_settings = worker_heartbeat_v2.handler_settings,
           heartbeat_interval = make_interval(secs => worker_heartbeat_v2.heartbeat_interval),
           heartbeat_at = now(), hand_back_seen_at = w.hand_back_requested_at
     WHERE w.id = worker_heartbeat_v2.id AND w.state <> 'gone'
       AND w.secret_sha256 = @schema@.worker_secret_digest(worker_heartbeat_v2.secret)
    RETURNING w.drain_requested, w.hand_back_requested_at,
              extract(epoch FROM w.hand_back_grace)::float8, w.hand_back_queues,
              w.hand_back_handlers;
END;
$$;

-- A daemon that exits cleanly marks its own row gone; its peers hear so.
CREATE FUNCTION @schema@.worker_deregister_v2(id text, secret text)
RETURNS SETOF text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH gone AS (
        UPDATE @schema@.workers w
           SET state = 'gone', in_flight = '{}', stopped_at = now(), heartbeat_at = now()
         WHERE w.id = worker_deregister_v2.id
           AND w.secret_sha256 = @schema@.worker_secret_digest(worker_deregister_v2.secret)
        RETURNING w.id
    )
    SELECT g.id FROM gone g, LATERAL (
        SELECT pg_notify(@schema_literal@ || '.wake',
                         json_build_object('peer', 'down', 'id', g.id)::text)) AS sent;
END;
$$;

-- Which schedules the caller's own row declares (worker_schedules_set before schema 24).
CREATE FUNCTION @schema@.worker_schedules_set_v2(id text, secret text, schedules text[])
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    UPDATE @schema@.workers w SET schedules = coalesce(worker_schedules_set_v2.schedules, '{}')
     WHERE w.id = worker_schedules_set_v2.id
       AND w.secret_sha256 = @schema@.worker_secret_digest(worker_schedules_set_v2.secret);
    RETURN FOUND;
END;
$$;

-- Daemons silent for longer than `stale_after` seconds (60 at least: no caller marks a
-- live daemon gone) are marked gone, by one caller at a time (worker_mark_stale before
-- schema 24); returns them.
CREATE FUNCTION @schema@.worker_mark_stale_v2(stale_after float8)
RETURNS TABLE (id text, host text, pid integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF stale_after IS NULL OR NOT (stale_after BETWEEN 60 AND 86400) THEN
        RAISE EXCEPTION 'pgworkerd: stale_after must be from 60 to 86400 seconds, not %',
            coalesce(stale_after::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH gone AS (
        UPDATE @schema@.workers w
           SET state = 'gone', stopped_at = now()
         WHERE (SELECT pg_try_advisory_xact_lock(
                    hashtextextended('pgworkerd.registry.mark_stale:' || @schema_literal@, 0)))
           AND w.state <> 'gone'
           AND w.heartbeat_at < now() - make_interval(secs => worker_mark_stale_v2.stale_after)
        RETURNING w.id, w.host, w.pid
    )
    SELECT g.id, g.host, g.pid FROM gone g, LATERAL (
        SELECT pg_notify(@schema_literal@ || '.wake',
                         json_build_object('peer', 'down', 'id', g.id)::text)) AS sent;
END;
$$;

REVOKE EXECUTE ON FUNCTION
    @schema@.worker_register_v2(text, text, text, integer, text, text[], text[], integer, text,
                                jsonb, float8),
    @schema@.worker_heartbeat_v2(text, text, text, bigint[], text[], text[], integer, jsonb,
                                 float8),
    @schema@.worker_deregister_v2(text, text),
    @schema@.worker_schedules_set_v2(text, text, text[]),
    @schema@.worker_mark_stale_v2(float8)
    FROM PUBLIC;

-- One text per fenced transition (migration 0025; its header has the table of who calls
-- what).

-- Refuse a fenced call (22023): `transition` says what was asked, `problem` what is wrong.
CREATE FUNCTION @schema@.fenced_refuse(transition text, problem text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'pgworkerd: %: %', transition, problem
        USING ERRCODE = 'invalid_parameter_value';
END;
$$;

-- The problem with the arguments every one-job transition takes; NULL when there is none.
-- A plain SQL expression without SET clauses, so the planner inlines it (no call at run
-- time).
CREATE FUNCTION @schema@.fenced_job_problem(worker text, job_id bigint, token bigint)
RETURNS text
LANGUAGE sql
STABLE
AS $$
    SELECT CASE
        WHEN worker IS NULL OR worker = '' THEN
            'worker must name the worker that holds the job (as it claimed it), not '
            || coalesce(pg_catalog.quote_literal(worker), 'NULL')
        WHEN job_id IS NULL THEN 'job_id must be the id of a claimed job, not NULL'
        WHEN token IS NULL THEN
            'token must be the lease_token the claim returned for the job, not NULL'
    END
$$;

-- The problem with a batch's arrays (ids and tokens, then the others given, one element
-- per job); NULL when there is none. Inlined like fenced_job_problem.
CREATE FUNCTION @schema@.fenced_batch_problem(
    worker text, ids bigint[], tokens bigint[], others anyarray DEFAULT NULL::text[],
    lease_seconds float8[] DEFAULT NULL)
RETURNS text
LANGUAGE sql
STABLE
AS $$
    SELECT CASE
        WHEN worker IS NULL OR worker = '' THEN
            'worker must name the worker that holds the jobs (as it claimed them), not '
            || coalesce(pg_catalog.quote_literal(worker), 'NULL')
        WHEN ids IS NULL OR pg_catalog.cardinality(ids) = 0
             OR pg_catalog.array_ndims(ids) > 1 THEN
            'ids must be a one-dimensional array of at least one job id, not '
            || coalesce(left(ids::text, 200), 'NULL')
        WHEN pg_catalog.cardinality(ids) > 100000 THEN
            'at most 100000 jobs at once, not ' || pg_catalog.cardinality(ids)
        WHEN pg_catalog.array_position(ids, NULL) IS NOT NULL THEN
            'ids must not hold NULL: ' || left(ids::text, 200)
        WHEN tokens IS NULL OR pg_catalog.array_ndims(tokens) > 1
             OR pg_catalog.cardinality(tokens) <> pg_catalog.cardinality(ids)
             OR pg_catalog.array_position(tokens, NULL) IS NOT NULL THEN
            'tokens must give each job of ids its lease_token (the same number of elements, '
            || 'none NULL), not ' || coalesce(left(tokens::text, 200), 'NULL')
        WHEN others IS NOT NULL
             AND (pg_catalog.array_ndims(others) > 1
                  OR pg_catalog.cardinality(others) <> pg_catalog.cardinality(ids)) THEN
            'every per-job array must have one element per job of ids ('
            || pg_catalog.cardinality(ids) || '), not ' || pg_catalog.cardinality(others)
        WHEN lease_seconds IS NOT NULL
             AND (pg_catalog.array_ndims(lease_seconds) > 1
                  OR pg_catalog.cardinality(lease_seconds) <> pg_catalog.cardinality(ids)
                  -- NaN is above every number: refused by the second test; so is NULL
                  OR (0 < ALL(lease_seconds) AND 3153600000 >= ALL(lease_seconds))
                     IS NOT TRUE) THEN
            'lease_seconds must give each job its lease in seconds (above 0, at most 100 '
            || 'years), one per job of ids, not ' || left(lease_seconds::text, 200)
    END
$$;

-- renew: many leases of one worker at once (the daemon's job_renew), each renewed with
-- its progress and checkpoint (NULL keeps the old value), or reported lost.
CREATE OR REPLACE FUNCTION @schema@.renew_leases(
    worker text, ids bigint[], tokens bigint[], lease_seconds float8[], progress jsonb[],
    checkpoints jsonb[])
RETURNS TABLE (id bigint, renewed boolean, cancel_requested boolean,
               locked_until timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text := coalesce(
        @schema@.fenced_batch_problem(renew_leases.worker, renew_leases.ids,
                                      renew_leases.tokens, renew_leases.progress,
                                      renew_leases.lease_seconds),
        @schema@.fenced_batch_problem(renew_leases.worker, renew_leases.ids,
                                      renew_leases.tokens, renew_leases.checkpoints));
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM @schema@.fenced_refuse('renewing leases', problem);
    END IF;
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    RETURN QUERY
    WITH lease AS (
        SELECT * FROM unnest(renew_leases.ids, renew_leases.tokens,
                             renew_leases.lease_seconds, renew_leases.progress,
                             renew_leases.checkpoints)
                 AS l(id, token, lease_seconds, progress, checkpoint)
    ), renewed AS (
        UPDATE @schema@.jobs j
           SET locked_until = now() + make_interval(secs => l.lease_seconds),
               progress = coalesce(l.progress, j.progress),
               checkpoint = coalesce(l.checkpoint, j.checkpoint),
               updated_at = now()
          FROM lease l
         WHERE j.id = ANY(renew_leases.ids) AND j.id = l.id AND j.lease_token = l.token
           AND j.locked_by = renew_leases.worker AND j.status::text = 'running'
        RETURNING j.id, j.cancel_requested, j.locked_until
    )
    SELECT l.id, r.id IS NOT NULL, coalesce(r.cancel_requested, false), r.locked_until
      FROM lease l LEFT JOIN renewed r ON r.id = l.id;
END;
$$;

-- renew for one lease (other languages): renew_leases for one job. One row if the lease
-- held (cancel_requested: stop the job; locked_until: the new end), none if it was lost.
CREATE OR REPLACE FUNCTION @schema@.renew_lease(
    job_id bigint, worker text, token bigint, lease_seconds float8,
    progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS TABLE (cancel_requested boolean, locked_until timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT r.cancel_requested, r.locked_until
      FROM @schema@.renew_leases(renew_lease.worker, ARRAY[renew_lease.job_id],
                                 ARRAY[renew_lease.token], ARRAY[renew_lease.lease_seconds],
                                 ARRAY[renew_lease.progress], ARRAY[renew_lease.checkpoint]) r
     WHERE r.renewed;
END;
$$;

-- complete: jobs their holder still owns (the daemon's job_complete), each with an
-- optional result; returns the ids completed (a missing one lost its lease).
CREATE OR REPLACE FUNCTION @schema@.complete_jobs(
    worker text, ids bigint[], tokens bigint[], results jsonb[], progress jsonb[])
RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text := coalesce(
        @schema@.fenced_batch_problem(complete_jobs.worker, complete_jobs.ids,
                                      complete_jobs.tokens, complete_jobs.results),
        @schema@.fenced_batch_problem(complete_jobs.worker, complete_jobs.ids,
                                      complete_jobs.tokens, complete_jobs.progress));
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM @schema@.fenced_refuse('completing jobs', problem);
    END IF;
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    RETURN QUERY
    WITH done AS (
        SELECT * FROM unnest(complete_jobs.ids, complete_jobs.tokens, complete_jobs.results,
                             complete_jobs.progress) AS d(id, token, result, progress)
    )
    UPDATE @schema@.jobs j
       SET status = 'completed', result = d.result,
           progress = coalesce(d.progress, j.progress),
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           finished_at = now(), updated_at = now()
      FROM done d
     WHERE j.id = ANY(complete_jobs.ids) AND j.id = d.id AND j.locked_by = complete_jobs.worker
       AND j.lease_token = d.token AND j.status::text = 'running'
    RETURNING j.id;
END;
$$;

-- complete for one job (other languages, and the daemon's job_complete_one):
-- complete_jobs for one job. True if the lease held.
CREATE OR REPLACE FUNCTION @schema@.complete_job(
    job_id bigint, worker text, token bigint, result jsonb DEFAULT NULL,
    progress jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN EXISTS (
        SELECT FROM @schema@.complete_jobs(complete_job.worker, ARRAY[complete_job.job_id],
                                           ARRAY[complete_job.token],
                                           ARRAY[complete_job.result],
                                           ARRAY[complete_job.progress]));
END;
$$;

-- fail, snooze_held_job and snooze_job gain retry_in: a new result type, so they are
-- dropped and created again. Their grants are kept here (roles.sql's, and those 0022 gave
-- the roles of earlier releases) and given back once they exist again.
CREATE TEMPORARY TABLE fenced_0025_grants AS
SELECT p.proname::text AS function, pg_catalog.pg_get_userbyid(a.grantee) AS grantee
  FROM pg_catalog.pg_proc p, aclexplode(p.proacl) a
 WHERE p.pronamespace = '@schema@'::regnamespace
   AND p.proname IN ('fail_job', 'snooze_held_job', 'snooze_job')
   AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner;

DROP FUNCTION @schema@.snooze_job(bigint, text, bigint, float8, integer, jsonb, jsonb);
DROP FUNCTION @schema@.snooze_held_job(bigint, text, bigint, float8, integer, jsonb, jsonb);
DROP FUNCTION @schema@.fail_job(bigint, text, bigint, text, float8, float8, jsonb, jsonb);

-- fail: a failed attempt. Back to pending after exponential backoff (backoff_base *
-- 2^(attempts-1), at most backoff_max, +-25 % jitter), or dead once max_attempts are
-- used, or cancelled if a cancel was requested meanwhile; the attempt's progress and
-- checkpoint saved (NULL keeps the old ones). Returns the new status, run_at and
-- retry_in; no row: the lease was lost and nothing changed.
CREATE FUNCTION @schema@.fail_job(
    job_id bigint, worker text, token bigint, error text,
    backoff_base float8 DEFAULT 10, backoff_max float8 DEFAULT 3600,
    progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS TABLE (status text, run_at timestamptz, retry_in float8)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text := @schema@.fenced_job_problem(fail_job.worker, fail_job.job_id,
                                                fail_job.token);
BEGIN
    IF problem IS NULL
       AND (fail_job.backoff_base BETWEEN 0 AND 3153600000
            AND fail_job.backoff_max BETWEEN 0 AND 3153600000) IS NOT TRUE THEN
        problem := 'backoff_base and backoff_max must be seconds from 0 to 100 years, not '
                   || coalesce(fail_job.backoff_base::text, 'NULL') || ' and '
                   || coalesce(fail_job.backoff_max::text, 'NULL');
    END IF;
    IF problem IS NOT NULL THEN
        PERFORM @schema@.fenced_refuse('failing an attempt', problem);
    END IF;
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    RETURN QUERY
    UPDATE @schema@.jobs j
       SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                         WHEN j.attempts >= j.max_attempts THEN 'dead'
                         ELSE 'pending' END::@schema@.job_status,
           run_at = CASE WHEN j.cancel_requested OR j.attempts >= j.max_attempts THEN j.run_at
                         ELSE now() + make_interval(secs =>
                              least(fail_job.backoff_max,
                                    fail_job.backoff_base
                                    * power(2::float8, least(j.attempts - 1, 60)::float8))
                              * (0.75 + 0.5 * random())) END,
           finished_at = CASE WHEN j.cancel_requested OR j.attempts >= j.max_attempts
                              THEN now() END,
           last_error = fail_job.error,
           progress = coalesce(fail_job.progress, j.progress),
           checkpoint = coalesce(fail_job.checkpoint, j.checkpoint),
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           updated_at = now()
     WHERE j.id = fail_job.job_id AND j.locked_by = fail_job.worker
       AND j.lease_token = fail_job.token AND j.status::text = 'running'
    RETURNING j.status::text, j.run_at,
              CASE WHEN j.status::text = 'pending'
                   THEN extract(epoch FROM j.run_at - now())::float8 END;
END;
$$;

-- snooze (the one text): the handler asked to run again in delay_seconds (0 to 2592000,
-- 30 days), which is not a failure: pending again at now() + delay with the attempt not
-- counted and one more snooze counted (cancelled if a cancel was requested meanwhile),
-- progress and checkpoint saved (NULL keeps the old ones), last_error kept. No row when
-- the job has snoozed max_snoozes times already (the daemon then records a failed
-- attempt; snooze_job does it itself), nor when the lease was lost.
CREATE FUNCTION @schema@.snooze_held_job(
    job_id bigint, worker text, token bigint, delay_seconds float8, max_snoozes integer,
    progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS TABLE (status text, run_at timestamptz, snoozes integer, retry_in float8)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text := @schema@.fenced_job_problem(snooze_held_job.worker,
                                                snooze_held_job.job_id,
                                                snooze_held_job.token);
BEGIN
    -- (NaN is above every number in PostgreSQL: refused too)
    IF problem IS NULL
       AND (snooze_held_job.delay_seconds BETWEEN 0 AND 2592000) IS NOT TRUE THEN
        problem := 'a snooze must be from 0 to 2592000 seconds (30 days), not '
                   || coalesce(snooze_held_job.delay_seconds::text, 'NULL');
    END IF;
    IF problem IS NULL AND (snooze_held_job.max_snoozes >= 0) IS NOT TRUE THEN
        problem := 'max_snoozes must be 0 or more, not '
                   || coalesce(snooze_held_job.max_snoozes::text, 'NULL');
    END IF;
    IF problem IS NOT NULL THEN
        PERFORM @schema@.fenced_refuse('snoozing a job', problem);
    END IF;
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    RETURN QUERY
    UPDATE @schema@.jobs j
       SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                         ELSE 'pending' END::@schema@.job_status,
           run_at = CASE WHEN j.cancel_requested THEN j.run_at
                         ELSE now() + make_interval(secs => snooze_held_job.delay_seconds) END,
           finished_at = CASE WHEN j.cancel_requested THEN now() END,
           attempts = j.attempts - 1,
           snoozes = j.snoozes + 1,
           progress = coalesce(snooze_held_job.progress, j.progress),
           checkpoint = coalesce(snooze_held_job.checkpoint, j.checkpoint),
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           updated_at = now()
     WHERE j.id = snooze_held_job.job_id AND j.locked_by = snooze_held_job.worker
       AND j.lease_token = snooze_held_job.token AND j.status::text = 'running'
       AND j.snoozes < snooze_held_job.max_snoozes
    RETURNING j.status::text, j.run_at, j.snoozes,
              CASE WHEN j.status::text = 'pending'
                   THEN extract(epoch FROM j.run_at - now())::float8 END;
END;
$$;

-- snooze for other languages: snooze_held_job, and past max_snoozes (NULL: 100) a failed
-- attempt instead, by fail_job with its default backoff, the error saying why. Returns
-- the new status, run_at and retry_in; no row: the lease was lost and nothing changed.
CREATE FUNCTION @schema@.snooze_job(
    job_id bigint, worker text, token bigint, delay_seconds float8,
    max_snoozes integer DEFAULT 100,
    progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS TABLE (status text, run_at timestamptz, retry_in float8)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT s.status, s.run_at, s.retry_in
      FROM @schema@.snooze_held_job(snooze_job.job_id, snooze_job.worker, snooze_job.token,
                                    snooze_job.delay_seconds,
                                    coalesce(snooze_job.max_snoozes, 100),
                                    snooze_job.progress, snooze_job.checkpoint) s;
    IF NOT FOUND THEN
        -- max_snoozes used up (or the lease lost: fail_job is fenced the same way)
        RETURN QUERY
        SELECT * FROM @schema@.fail_job(
            snooze_job.job_id, snooze_job.worker, snooze_job.token,
            'snoozed ' || coalesce(snooze_job.max_snoozes, 100)
                || ' times already (max_snoozes): this snooze counts as a failed attempt',
            progress => snooze_job.progress, checkpoint => snooze_job.checkpoint);
    END IF;
END;
$$;

REVOKE EXECUTE ON FUNCTION
    @schema@.fail_job(bigint, text, bigint, text, float8, float8, jsonb, jsonb),
    @schema@.snooze_held_job(bigint, text, bigint, float8, integer, jsonb, jsonb),
    @schema@.snooze_job(bigint, text, bigint, float8, integer, jsonb, jsonb)
    FROM PUBLIC;

DO $$
DECLARE
    kept record;
BEGIN
    FOR kept IN SELECT g.function, g.grantee FROM fenced_0025_grants g LOOP
        EXECUTE pg_catalog.format(
            'GRANT EXECUTE ON FUNCTION %s TO %I',
            CASE kept.function
                WHEN 'fail_job' THEN '@schema@.fail_job(bigint, text, bigint, text, float8, '
                                     'float8, jsonb, jsonb)'
                WHEN 'snooze_held_job' THEN '@schema@.snooze_held_job(bigint, text, bigint, '
                                            'float8, integer, jsonb, jsonb)'
                ELSE '@schema@.snooze_job(bigint, text, bigint, float8, integer, jsonb, jsonb)'
            END,
            kept.grantee);
    END LOOP;
END
$$;
DROP TABLE pg_temp.fenced_0025_grants;

-- release: hand a held job back (drain, hand-back, shutdown) without counting the
-- attempt: pending at once and in its old place in the queue (run_at kept), or cancelled
-- if a cancel was requested; its progress and checkpoint saved (NULL keeps the old ones).
-- The peers that serve it are woken on commit as for a new job (the wake channel's
-- {"q", "h", "id", "n"}, daemon/peers.py), so another daemon starts it at once. Returns
-- the new status; NULL: the lease was lost and nothing changed.
CREATE OR REPLACE FUNCTION @schema@.release_job(
    job_id bigint, worker text, token bigint,
    progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text := @schema@.fenced_job_problem(release_job.worker, release_job.job_id,
                                                release_job.token);
    released record;
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM @schema@.fenced_refuse('releasing a job', problem);
    END IF;
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    UPDATE @schema@.jobs j
       SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                         ELSE 'pending' END::@schema@.job_status,
           finished_at = CASE WHEN j.cancel_requested THEN now() END,
           attempts = j.attempts - 1,
           progress = coalesce(release_job.progress, j.progress),
           checkpoint = coalesce(release_job.checkpoint, j.checkpoint),
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           updated_at = now()
     WHERE j.id = release_job.job_id AND j.locked_by = release_job.worker
       AND j.lease_token = release_job.token AND j.status::text = 'running'
    RETURNING j.status::text AS status, j.queue, j.handler INTO released;
    IF released.status = 'pending' THEN
        PERFORM pg_notify(@schema_literal@ || '.wake',
            CASE WHEN octet_length(released.queue) + octet_length(released.handler) <= 2048
                 THEN json_build_object('q', released.queue, 'h', released.handler,
                                        'id', release_job.job_id, 'n', 1)
                 ELSE json_build_object('id', release_job.job_id, 'n', 1) END::text);
    END IF;
    RETURN released.status;
END;
$$;

-- give up (and the daemon's burial of a job it cannot run): dead at once, whatever
-- attempts are left, with the reason. True if the lease held.
CREATE OR REPLACE FUNCTION @schema@.give_up_job(job_id bigint, worker text, token bigint, reason text)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text := @schema@.fenced_job_problem(give_up_job.worker, give_up_job.job_id,
                                                give_up_job.token);
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM @schema@.fenced_refuse('giving up a job', problem);
    END IF;
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    UPDATE @schema@.jobs j
       SET status = 'dead', last_error = give_up_job.reason,
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           finished_at = now(), updated_at = now()
     WHERE j.id = give_up_job.job_id AND j.locked_by = give_up_job.worker
       AND j.lease_token = give_up_job.token AND j.status::text = 'running';
    RETURN FOUND;
END;
$$;

-- cancel: the holder stopped a job whose cancellation was requested: cancelled, with the
-- reason and its latest progress (NULL keeps the old value). Returns 'cancelled', or
-- NULL when the lease was lost.
CREATE OR REPLACE FUNCTION @schema@.cancel_held_job(
    job_id bigint, worker text, token bigint, reason text, progress jsonb DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text := @schema@.fenced_job_problem(cancel_held_job.worker,
                                                cancel_held_job.job_id,
                                                cancel_held_job.token);
    new_status text;
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM @schema@.fenced_refuse('cancelling a held job', problem);
    END IF;
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    UPDATE @schema@.jobs j
       SET status = 'cancelled', last_error = cancel_held_job.reason,
           progress = coalesce(cancel_held_job.progress, j.progress),
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           finished_at = now(), updated_at = now()
     WHERE j.id = cancel_held_job.job_id AND j.locked_by = cancel_held_job.worker
       AND j.lease_token = cancel_held_job.token AND j.status::text = 'running'
    RETURNING j.status::text INTO new_status;
    RETURN new_status;
END;
$$;

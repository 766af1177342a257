-- Bounds an operator sets on what enqueuers may ask (issue 22, N11).
-- compatible-with-code-of-schema: 5
--
-- An expand migration (README "Upgrading"): a new table and check function; enqueue,
-- enqueue_many and enqueue_many_v2 are replaced with the same signatures and the same
-- behaviour while the table is empty (every bound, message and SQLSTATE as before), plus
-- one look-up of the table per call. enqueue_v2 and schedule_fire call enqueue_many(_v2)
-- and are checked through them. Code of every schema from 5 on runs unchanged.
--
-- Measured (bench/enqueue_bounds_bench.py, 40 rounds, a shared 2-CPU VM at load ~12): no
-- bound set, throughput as before (single enqueues 1.03x, enqueue_many of 2,000 0.99x); a
-- bound that binds the caller, 0.94x and 0.95x (README "Enqueue bounds").

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

-- The enqueue functions, each with the check before it writes anything.

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

-- Fleet-wide concurrency limits, concurrency keys, pausing queues and handlers.
-- compatible-with-code-of-schema: 5
--
-- An expand migration (README "Upgrading"): nothing existing changes. Jobs gain a nullable
-- concurrency_key (no default: adding it rewrites nothing). enqueue, enqueue_many,
-- claim() and claim_v2 stay as they are for the code that calls them (release 0.2 and
-- the code of schema 8): they know no key, no limit and no pause. The new code calls:
--   enqueue_v2       enqueue's arguments plus concurrency_key
--   enqueue_many_v2  enqueue_many, whose job objects may also carry "concurrency_key"
--                    (enqueue_many refuses unknown keys, so it cannot take it)
--   claim_v3         claim_v2's arguments plus each handler's max_running and
--                    max_running_per_key; skips paused queues and handlers
--   pause_queue, resume_queue, pause_handler, resume_handler
--
-- What a slot is: a running attempt whose lease is current (status = 'running' AND
-- locked_until > now()). The fenced finish frees it (the row leaves 'running'), and so
-- does the lease running out: a killed host's job stops counting when its lease ends,
-- and when the rescue path claims it again that claim counts like any other.

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

-- claim_v3: claim_v2 plus fleet-wide limits and pauses.
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

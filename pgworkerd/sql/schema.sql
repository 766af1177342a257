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
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- The migrations this declaration includes, so that `pgworkerd migrate` after it is a no-op.
INSERT INTO @schema@.schema_version (version, name) VALUES
    (1, 'jobs'),
    (2, 'workers');

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
-- Dedupe: one live (pending or running) job per key.
CREATE UNIQUE INDEX jobs_dedupe_live_idx ON @schema@.jobs (dedupe_key)
    WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running');
-- Retention pruning and operators' look-ups of finished jobs.
CREATE INDEX jobs_finished_at_idx ON @schema@.jobs (finished_at)
    WHERE finished_at IS NOT NULL;

-- The one definition of enqueue. Takes a JSON array of job objects:
--   {"handler": text, "payload": object, "queue": text, "priority": int,
--    "run_at": timestamptz | "delay": interval, "max_attempts": int, "dedupe_key": text}
-- and returns the job ids in input order. A dedupe key that matches a pending or running
-- job returns that job's id instead of inserting. Listeners are notified on commit.
CREATE FUNCTION @schema@.enqueue_many(jobs jsonb)
RETURNS bigint[]
LANGUAGE plpgsql
-- Definer's rights: enqueuers need EXECUTE only, no rights on the table.
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bad record;
    ids bigint[];
BEGIN
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' THEN
        RAISE EXCEPTION 'pgworkerd: enqueue_many expects a JSON array of job objects'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT n, problem INTO bad FROM (
        SELECT n, CASE
            WHEN jsonb_typeof(e) <> 'object' THEN 'is not a JSON object'
            WHEN jsonb_typeof(e->'handler') IS DISTINCT FROM 'string' OR e->>'handler' = ''
                THEN 'needs a non-empty "handler" string'
            WHEN e ? 'payload' AND jsonb_typeof(e->'payload') <> 'object'
                THEN 'payload must be a JSON object, not ' || jsonb_typeof(e->'payload')
            WHEN e ? 'queue' AND (jsonb_typeof(e->'queue') <> 'string' OR e->>'queue' = '')
                THEN 'queue must be a non-empty string'
            WHEN e ? 'max_attempts' AND CASE WHEN jsonb_typeof(e->'max_attempts') <> 'number'
                                             THEN true
                                             ELSE (e->>'max_attempts')::numeric < 1
                                               OR (e->>'max_attempts')::numeric % 1 <> 0 END
                THEN 'max_attempts must be a positive integer, not ' || (e->>'max_attempts')
            WHEN e ? 'priority' AND CASE WHEN jsonb_typeof(e->'priority') <> 'number'
                                         THEN true
                                         ELSE (e->>'priority')::numeric % 1 <> 0 END
                THEN 'priority must be an integer, not ' || (e->>'priority')
            WHEN e ? 'run_at' AND e ? 'delay' THEN 'give run_at or delay, not both'
            WHEN e ? 'dedupe_key' AND jsonb_typeof(e->'dedupe_key') NOT IN ('string', 'null')
                THEN 'dedupe_key must be a string'
            END AS problem
        FROM jsonb_array_elements(jobs) WITH ORDINALITY AS t(e, n)
    ) checked WHERE problem IS NOT NULL ORDER BY n LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'pgworkerd: job % of %: %', bad.n, jsonb_array_length(jobs), bad.problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    WITH input AS (
        SELECT n, e, nextval('@schema@.jobs_id_seq') AS new_id
        FROM jsonb_array_elements(jobs) WITH ORDINALITY AS t(e, n)
    ), inserted AS (
        INSERT INTO @schema@.jobs AS j
            (id, queue, handler, payload, priority, run_at, max_attempts, dedupe_key)
        SELECT new_id,
               coalesce(e->>'queue', 'default'),
               e->>'handler',
               coalesce(e->'payload', '{}'),
               coalesce((e->>'priority')::integer, 0),
               coalesce((e->>'run_at')::timestamptz,
                        now() + coalesce((e->>'delay')::interval, interval '0')),
               coalesce((e->>'max_attempts')::integer, 5),
               e->>'dedupe_key'
        FROM input
        ORDER BY n
        ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running')
            DO NOTHING
        RETURNING j.id, j.dedupe_key
    )
    SELECT array_agg(coalesce(
               ins.id,
               -- an equal key earlier in this same batch
               (SELECT min(i2.id) FROM inserted i2 WHERE i2.dedupe_key = input.e->>'dedupe_key'),
               -- an equal live job that already existed
               (SELECT ex.id FROM @schema@.jobs ex
                 WHERE ex.dedupe_key = input.e->>'dedupe_key'
                   AND ex.status IN ('pending', 'running')))
           ORDER BY input.n)
      INTO ids
      FROM input LEFT JOIN inserted ins ON ins.id = input.new_id;

    IF array_position(ids, NULL) IS NOT NULL THEN
        -- The live job we collided with committed after our snapshot or finished meanwhile.
        RAISE EXCEPTION 'pgworkerd: a job with an equal dedupe key changed concurrently; retry'
            USING ERRCODE = 'serialization_failure';
    END IF;

    PERFORM pg_notify(@schema_literal@ || '.jobs', q)
       FROM (SELECT DISTINCT coalesce(e->>'queue', 'default') AS q
               FROM jsonb_array_elements(jobs) AS t(e)) queues;
    RETURN coalesce(ids, '{}');
END;
$$;

-- Enqueue one job; arguments as in enqueue_many. Returns its id.
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
BEGIN
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION 'pgworkerd: payload must be a JSON object, not %',
            coalesce(jsonb_typeof(payload), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN (@schema@.enqueue_many(jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
        'handler', handler, 'queue', queue, 'priority', priority, 'run_at', run_at,
        'delay', delay, 'max_attempts', max_attempts, 'dedupe_key', dedupe_key))
        || jsonb_build_object('payload', payload))))[1];
END;
$$;

-- Granted explicitly (see deploy/roles.sql), not to everyone.
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

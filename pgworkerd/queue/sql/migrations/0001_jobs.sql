-- 0001: the job table, its indexes and the enqueue functions.
-- @schema@ is replaced by the quoted schema name, @schema_literal@ by it as a string literal.

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

-- Why job `n` of `total` in an enqueue_many array is invalid: raises the error naming it.
-- Only called for a job that failed enqueue_many's inline check, so valid batches never
-- pay for it; declared to return text so that it fits in the insert's column list.
CREATE FUNCTION @schema@.enqueue_reject(e jsonb, n bigint, total integer)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'pgworkerd: job % of %: %', n, total, CASE
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
        ELSE 'is invalid'
        END
        USING ERRCODE = 'invalid_parameter_value';
END;
$$;

-- The one definition of enqueue. Takes a JSON array of job objects:
--   {"handler": text, "payload": object, "queue": text, "priority": int,
--    "run_at": timestamptz | "delay": interval, "max_attempts": int, "dedupe_key": text}
-- and returns the job ids in input order. A dedupe key that matches a pending or running
-- job returns that job's id instead of inserting. Listeners are notified on commit, once
-- per queue.
--
-- One pass over the array: every job is checked inline as it is inserted (a bad one makes
-- enqueue_reject raise, naming it, and nothing is written); batches without dedupe keys
-- skip ON CONFLICT and the look-up of existing jobs.
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

    IF NOT jsonb_path_exists(jobs, '$[*] ? (exists(@.dedupe_key) && @.dedupe_key != null)')
    THEN
        -- No dedupe keys: a plain insert. Ids come from the sequence in row order, and the
        -- rows are inserted in input order, so sorted ids are in input order.
        WITH inserted AS (
            INSERT INTO @schema@.jobs AS j
                (queue, handler, payload, priority, run_at, max_attempts)
            SELECT coalesce(e->>'queue', 'default'),
                   CASE WHEN jsonb_typeof(e) = 'object'
                         AND jsonb_typeof(e->'handler') = 'string' AND e->>'handler' <> ''
                         AND (jsonb_typeof(e->'payload') = 'object' OR NOT e ? 'payload')
                         AND (NOT e ? 'queue'
                              OR (jsonb_typeof(e->'queue') = 'string' AND e->>'queue' <> ''))
                         AND CASE WHEN NOT e ? 'max_attempts' THEN true
                                  WHEN jsonb_typeof(e->'max_attempts') <> 'number' THEN false
                                  ELSE (e->>'max_attempts')::numeric >= 1
                                   AND (e->>'max_attempts')::numeric % 1 = 0 END
                         AND CASE WHEN NOT e ? 'priority' THEN true
                                  WHEN jsonb_typeof(e->'priority') <> 'number' THEN false
                                  ELSE (e->>'priority')::numeric % 1 = 0 END
                         AND NOT (e ? 'run_at' AND e ? 'delay')
                        THEN e->>'handler'
                        ELSE @schema@.enqueue_reject(e, n, total) END,
                   coalesce(e->'payload', '{}'),
                   coalesce((e->>'priority')::integer, 0),
                   coalesce((e->>'run_at')::timestamptz,
                            now() + coalesce((e->>'delay')::interval, interval '0')),
                   coalesce((e->>'max_attempts')::integer, 5)
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
                   CASE WHEN jsonb_typeof(e) = 'object'
                         AND jsonb_typeof(e->'handler') = 'string' AND e->>'handler' <> ''
                         AND (jsonb_typeof(e->'payload') = 'object' OR NOT e ? 'payload')
                         AND (NOT e ? 'queue'
                              OR (jsonb_typeof(e->'queue') = 'string' AND e->>'queue' <> ''))
                         AND CASE WHEN NOT e ? 'max_attempts' THEN true
                                  WHEN jsonb_typeof(e->'max_attempts') <> 'number' THEN false
                                  ELSE (e->>'max_attempts')::numeric >= 1
                                   AND (e->>'max_attempts')::numeric % 1 = 0 END
                         AND CASE WHEN NOT e ? 'priority' THEN true
                                  WHEN jsonb_typeof(e->'priority') <> 'number' THEN false
                                  ELSE (e->>'priority')::numeric % 1 = 0 END
                         AND NOT (e ? 'run_at' AND e ? 'delay')
                         AND (NOT e ? 'dedupe_key'
                              OR jsonb_typeof(e->'dedupe_key') IN ('string', 'null'))
                        THEN e->>'handler'
                        ELSE @schema@.enqueue_reject(e, n, total) END AS handler,
                   coalesce(e->'payload', '{}') AS payload,
                   coalesce((e->>'priority')::integer, 0) AS priority,
                   coalesce((e->>'run_at')::timestamptz,
                            now() + coalesce((e->>'delay')::interval, interval '0')) AS run_at,
                   coalesce((e->>'max_attempts')::integer, 5) AS max_attempts,
                   e->>'dedupe_key' AS dedupe_key
            FROM jsonb_array_elements(jobs) WITH ORDINALITY AS t(e, n)
        ), inserted AS (
            INSERT INTO @schema@.jobs AS j
                (id, queue, handler, payload, priority, run_at, max_attempts, dedupe_key)
            SELECT new_id, queue, handler, payload, priority, run_at, max_attempts, dedupe_key
            FROM input
            ORDER BY n
            ON CONFLICT (dedupe_key)
                WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running')
                DO NOTHING
            RETURNING j.id, j.dedupe_key
        )
        SELECT array_agg(coalesce(
                   ins.id,
                   -- an equal key earlier in this same batch
                   (SELECT min(i2.id) FROM inserted i2 WHERE i2.dedupe_key = input.dedupe_key),
                   -- an equal live job that already existed
                   (SELECT ex.id FROM @schema@.jobs ex
                     WHERE ex.dedupe_key = input.dedupe_key
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

-- Enqueue one job; arguments as in enqueue_many. Returns its id. A lean single-row path
-- (one INSERT .. ON CONFLICT), with the same checks and messages as enqueue_many.
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
    new_id bigint;
BEGIN
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' OR handler IS NULL OR handler = ''
       OR queue = '' OR max_attempts < 1 OR (run_at IS NOT NULL AND delay IS NOT NULL) THEN
        -- one test above for the common case, then the message
        IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
            RAISE EXCEPTION 'pgworkerd: payload must be a JSON object, not %',
                coalesce(jsonb_typeof(payload), 'NULL')
                USING ERRCODE = 'invalid_parameter_value';
        ELSIF handler IS NULL OR handler = '' THEN
            RAISE EXCEPTION 'pgworkerd: job 1 of 1: needs a non-empty "handler" string'
                USING ERRCODE = 'invalid_parameter_value';
        ELSIF queue = '' THEN
            RAISE EXCEPTION 'pgworkerd: job 1 of 1: queue must be a non-empty string'
                USING ERRCODE = 'invalid_parameter_value';
        ELSIF max_attempts < 1 THEN
            RAISE EXCEPTION
                'pgworkerd: job 1 of 1: max_attempts must be a positive integer, not %',
                max_attempts
                USING ERRCODE = 'invalid_parameter_value';
        ELSE
            RAISE EXCEPTION 'pgworkerd: job 1 of 1: give run_at or delay, not both'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    -- Arguments are named like columns: unqualified names are columns (use_column above),
    -- the arguments are written enqueue.name.
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
        ON CONFLICT (dedupe_key)
            WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running')
            DO NOTHING
        RETURNING j.id INTO new_id;
        IF new_id IS NULL THEN
            SELECT ex.id INTO new_id FROM @schema@.jobs ex
             WHERE ex.dedupe_key = enqueue.dedupe_key AND ex.status IN ('pending', 'running');
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

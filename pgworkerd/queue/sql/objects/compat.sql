-- What only older code calls. Each object says which code needs it (Needed by) and which
-- migration may drop it (Dropped by). None is dropped yet: every migration so far is an
-- expand migration compatible with code of schema 5 (release 0.2), and a function that
-- code of schema 5 or newer may call cannot go before a contract migration declares
-- compatibility only with newer code (docs/development/sql.md, "Versions and the
-- contract migration").
--
-- Beside these, enqueue and enqueue_many (enqueue.sql) notify the `<schema>.jobs` channel
-- that release 0.2's daemons listen on: the first contract migration may stop that too.

-- claim, version 1 (0003; search_path pinned in 0004).
-- Needed by: release 0.2 (schema 5) daemons, and SQL workers written against its README.
-- Dropped by: the first contract migration, which ends support for release 0.2.
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
-- SECURITY INVOKER: callers need UPDATE on the jobs table, so EXECUTE can stay granted
-- to everyone. (The daemon role has had no UPDATE on jobs since roles.sql of schema 22.)
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

COMMENT ON FUNCTION @schema@.claim(text, text[], text[], float8[], integer[], integer,
                                   integer[]) IS
    'Superseded; kept for release 0.2 daemons (schema 5) and SQL workers written against '
    'its README, during a rolling upgrade. It ignores pauses, fleet-wide limits and '
    'concurrency keys, and does not force a durable commit. New code calls claim_jobs.';

-- claim_v2 (0006): claim plus handler_queues.
-- Needed by: no release; only unreleased daemons of schemas 6 to 8 call it.
-- Dropped by: the first contract migration (dropping it sooner would need a migration
-- not compatible with code of schema 6: docs/development/sql.md, "Squashing").
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
-- SECURITY INVOKER: callers need UPDATE on the jobs table, so EXECUTE can stay granted
-- to everyone. (The daemon role has had no UPDATE on jobs since roles.sql of schema 22.)
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

COMMENT ON FUNCTION @schema@.claim_v2(text, text[], text[], float8[], integer[], integer,
                                      integer[], jsonb) IS
    'Superseded; called by no release, only by unreleased daemons of schemas 6 to 8. It '
    'ignores pauses and fleet-wide limits. New code calls claim_jobs.';

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

REVOKE EXECUTE ON FUNCTION @schema@.schedule_fire(text, timestamptz, jsonb, text, text)
    FROM PUBLIC;

-- prune_finished_v1 (0014).
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
-- Needed by: no release; daemons of schemas 14 to 19 (unreleased) call it. Current
-- daemons call prune_finished_v2 (retention.sql), which takes the same lock.
-- Dropped by: the first contract migration.
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

-- (0028) signal_send to the live job whose wait holds correlation key `wait_key` (WaitFor(...,
-- key=...)), for a sender that knows the key and not the id (a webhook). Returns
-- signal_send's row and the job's id. Refused (22023): no live job holds the key (or none
-- this login may read), a bad key.
-- Needed by: no release; code of schemas 28 to 31 (unreleased) calls it. Current code
-- calls signal_send_by_key_v2 (signals.sql), which parks a signal no live job takes.
-- Dropped by: the first contract migration.
CREATE FUNCTION @schema@.signal_send_by_key(wait_key text, name text, payload jsonb DEFAULT NULL)
RETURNS TABLE (job_id bigint, outcome text, status text, sent_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    found_id bigint;
BEGIN
    IF signal_send_by_key.wait_key IS NULL
       OR NOT @schema@.enqueue_name_ok(signal_send_by_key.wait_key)
       OR signal_send_by_key.wait_key = '' THEN
        RAISE EXCEPTION 'pgworkerd: signal refused: a correlation key must be 1 to 128 '
            'characters without control characters, not %',
            coalesce(pg_catalog.quote_literal(left(signal_send_by_key.wait_key, 200)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT j.id INTO found_id FROM @schema@.jobs j
     WHERE j.wait_key = signal_send_by_key.wait_key
       AND j.status IN ('pending', 'waiting', 'suspended', 'running')
       AND (j.enqueued_by = session_user
            OR has_any_column_privilege(session_user, '@schema@.jobs', 'SELECT'));
    IF found_id IS NULL THEN
        RAISE EXCEPTION 'pgworkerd: signal refused: no live job waits with correlation key % '
            '(or none this login may read)', pg_catalog.quote_literal(signal_send_by_key.wait_key)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    SELECT found_id, s.outcome, s.status, s.sent_at
      FROM @schema@.signal_send(found_id, signal_send_by_key.name,
                                signal_send_by_key.payload) s;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.signal_send_by_key(text, text, jsonb) FROM PUBLIC;

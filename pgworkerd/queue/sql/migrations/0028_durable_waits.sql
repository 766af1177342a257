-- Durable waits and signals (issue 24 item 4): a handler suspends its job until a named signal or a timeout (raise pgworkerd.WaitFor), and signals reach it by id or correlation key.
-- compatible-with-code-of-schema: 5
--
-- An expand migration (docs/operations/upgrading.md): five nullable columns on jobs
-- (no default: no table rewrite), two CHECKs added NOT VALID and validated after (a scan
-- that does not block writes), two partial indexes that hold only suspended jobs and
-- jobs with a correlation key, the signals table, new functions, and attempt_record
-- recording a wait as 'waited'. Older code never suspends a job and claims only 'pending'
-- ones: it runs unchanged. The grants at the end give the new functions to the roles that
-- hold a daemon's and an enqueuer's rights today; roles.sql of this release says the same.
-- (On a large jobs table an operator may build the two indexes beforehand with CREATE
-- INDEX CONCURRENTLY: they are created IF NOT EXISTS.)

ALTER TABLE @schema@.jobs
    ADD COLUMN wait_for text,
    ADD COLUMN wait_since timestamptz,
    ADD COLUMN wait_until timestamptz,
    ADD COLUMN wait_key text,
    ADD COLUMN wait_ended text;

ALTER TABLE @schema@.jobs
    ADD CONSTRAINT jobs_suspended_has_wait CHECK (
        status <> 'suspended'
        OR (wait_for IS NOT NULL AND wait_until IS NOT NULL AND wait_ended IS NULL)) NOT VALID,
    ADD CONSTRAINT jobs_wait_ended_known CHECK (wait_ended IN ('signal', 'timeout')) NOT VALID;
ALTER TABLE @schema@.jobs VALIDATE CONSTRAINT jobs_suspended_has_wait;
ALTER TABLE @schema@.jobs VALIDATE CONSTRAINT jobs_wait_ended_known;

-- Durable waits (0028): the daemons' timeout sweep (job_waits_expire) reads the
-- suspended jobs by timeout, and only them: a job that never waits costs nothing here.
CREATE INDEX IF NOT EXISTS jobs_suspended_until_idx ON @schema@.jobs (wait_until)
    WHERE status = 'suspended';

-- A correlation key names one live job (the one `pgworkerd signal --key` reaches): a
-- second live job waiting with the same key is refused (job_suspend).
CREATE UNIQUE INDEX IF NOT EXISTS jobs_wait_key_live_idx ON @schema@.jobs (wait_key)
    WHERE wait_key IS NOT NULL
      AND status IN ('pending', 'waiting', 'suspended', 'running');

-- A wait is an attempt's outcome of its own in the history: 'waited'.
ALTER TABLE @schema@.attempts DROP CONSTRAINT attempts_outcome_known;
ALTER TABLE @schema@.attempts
    ADD CONSTRAINT attempts_outcome_known CHECK (outcome IN (
        'completed', 'failed', 'dead', 'cancelled', 'released', 'snoozed', 'lease expired',
        'waited')) NOT VALID;
ALTER TABLE @schema@.attempts VALIDATE CONSTRAINT attempts_outcome_known;

CREATE OR REPLACE FUNCTION @schema@.attempt_record()
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
        -- a WaitFor (job_suspend, 0028): a new wait began
        WHEN NEW.wait_since IS DISTINCT FROM OLD.wait_since THEN 'waited'
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

-- One row per signal a job received, by name: the first write wins (a second signal of
-- the same name is reported as ignored and changes nothing), and a signal sent before the
-- job waits for it is kept here until it does. Removed with its job by the triggers
-- below (not a foreign key, as for attempts: TRUNCATE of jobs keeps working, and a
-- finish does not pay for a key check).
CREATE TABLE @schema@.signals (
    job_id   bigint NOT NULL,
    name     text NOT NULL,
    payload  jsonb,
    sent_at  timestamptz NOT NULL DEFAULT now(),
    -- the login that sent it (session_user: signal_send is SECURITY DEFINER)
    sent_by  text NOT NULL DEFAULT session_user,
    PRIMARY KEY (job_id, name),
    CONSTRAINT signals_name_ok CHECK (@schema@.enqueue_name_ok(name))
);

-- Deleted jobs (`pgworkerd prune`, retention, any DELETE or TRUNCATE by whatever role)
-- take their signals along: one statement per DELETE, however many jobs it removed.
CREATE FUNCTION @schema@.signals_forget()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        TRUNCATE @schema@.signals;
    ELSE
        DELETE FROM @schema@.signals s USING gone g WHERE s.job_id = g.id;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_signals_forget
    AFTER DELETE ON @schema@.jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.signals_forget();

CREATE TRIGGER jobs_signals_forget_all
    AFTER TRUNCATE ON @schema@.jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.signals_forget();

REVOKE EXECUTE ON FUNCTION @schema@.signals_forget() FROM PUBLIC;

-- Send signal `name` (a name like a handler's: enqueue_name_ok) with `payload` (any JSON
-- value or NULL; at most 64 MiB and nested at most 255 levels deep, enqueue's payload
-- bounds; jsonb itself refuses a NUL) to job `job_id`. Returns what became of it:
--   resumed  the job was suspended waiting for this name: pending now, its fleet woken;
--   kept     the job is live but not waiting for it (yet): the signal is kept, and the
--            job's next WaitFor for this name returns at once;
--   ignored  the job already has a signal of this name: first write wins, nothing changed
--            (sent_at says when the first came);
-- with the job's status after it. Refused (22023, nothing changed): an unknown job (or
-- one this login may not read: job_get_v1's rule, so it learns nothing of other
-- applications' jobs), a finished job, a bad name, a payload over the bounds.
-- SECURITY DEFINER: the enqueuer writes neither jobs nor signals itself. The job's row is
-- locked first, so a signal and job_suspend of the same job happen one after the other,
-- never interleaved: a signal is never lost between a wait's check and its suspension.
CREATE FUNCTION @schema@.signal_send(job_id bigint, name text, payload jsonb DEFAULT NULL)
RETURNS TABLE (outcome text, status text, sent_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    job record;
    first_sent timestamptz;
    problem text;
BEGIN
    problem := CASE
        WHEN signal_send.job_id IS NULL THEN 'job_id must be a job id, not NULL'
        WHEN signal_send.name IS NULL OR NOT @schema@.enqueue_name_ok(signal_send.name)
             OR signal_send.name = '' THEN
            'a signal name must be 1 to 128 characters without control characters, not '
            'beginning or ending with a space (like a handler''s name), not '
            || coalesce(pg_catalog.quote_literal(left(signal_send.name, 200)), 'NULL')
        WHEN pg_column_size(signal_send.payload || '[]'::jsonb) > 64 * 1024 * 1024 THEN
            'a signal payload must be at most 64 MiB, not '
            || pg_column_size(signal_send.payload || '[]'::jsonb) || ' bytes'
        WHEN jsonb_path_exists(signal_send.payload, 'strict $.**{256 to last}') THEN
            'a signal payload must be nested at most 255 levels deep'
    END;
    IF problem IS NULL THEN
        SELECT j.id, j.status::text AS status, j.wait_for INTO job
          FROM @schema@.jobs j
         WHERE j.id = signal_send.job_id
           AND (j.enqueued_by = session_user
                OR has_any_column_privilege(session_user, '@schema@.jobs', 'SELECT'))
           FOR UPDATE;
        IF NOT FOUND THEN
            problem := 'no job ' || signal_send.job_id || ' (or not one this login may read)';
        ELSIF job.status IN ('completed', 'dead', 'cancelled') THEN
            problem := 'job ' || signal_send.job_id || ' is ' || job.status
                       || ': a finished job takes no signal';
        END IF;
    END IF;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgworkerd: signal refused: %', problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    INSERT INTO @schema@.signals AS s (job_id, name, payload)
    VALUES (signal_send.job_id, signal_send.name, signal_send.payload)
    ON CONFLICT ON CONSTRAINT signals_pkey DO NOTHING;
    IF NOT FOUND THEN
        SELECT s.sent_at INTO first_sent FROM @schema@.signals s
         WHERE s.job_id = signal_send.job_id AND s.name = signal_send.name;
        RETURN QUERY SELECT 'ignored'::text, job.status, first_sent;
        RETURN;
    END IF;
    IF job.status = 'suspended' AND job.wait_for = signal_send.name THEN
        UPDATE @schema@.jobs j
           SET status = 'pending', wait_ended = 'signal', run_at = now(), updated_at = now()
         WHERE j.id = signal_send.job_id
        RETURNING j.queue, j.handler INTO job;
        PERFORM pg_notify(@schema_literal@ || '.wake',
            CASE WHEN octet_length(job.queue) + octet_length(job.handler) <= 2048
                 THEN json_build_object('q', job.queue, 'h', job.handler,
                                        'id', signal_send.job_id, 'n', 1)
                 ELSE json_build_object('id', signal_send.job_id, 'n', 1) END::text);
        RETURN QUERY SELECT 'resumed'::text, 'pending'::text, now();
        RETURN;
    END IF;
    RETURN QUERY SELECT 'kept'::text, job.status, now();
END;
$$;

-- signal_send to the live job whose wait holds correlation key `wait_key` (WaitFor(...,
-- key=...)), for a sender that knows the key and not the id (a webhook). Returns
-- signal_send's row and the job's id. Refused (22023): no live job holds the key (or none
-- this login may read), a bad key.
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

REVOKE EXECUTE ON FUNCTION
    @schema@.signal_send(bigint, text, jsonb),
    @schema@.signal_send_by_key(text, text, jsonb)
    FROM PUBLIC;

-- The daemons' timeout sweep (daemon/waits.py, on a cadence): suspended jobs past their
-- wait_until become pending at once (wait_ended 'timeout': their next attempt sees no
-- signal), at most `max_jobs` per call, rows another transaction holds (a signal landing
-- now) skipped; the peers that serve them are woken as for a new job. Returns how many.
-- SECURITY DEFINER: the daemon role has no UPDATE on jobs.
CREATE FUNCTION @schema@.job_waits_expire(max_jobs integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    moved integer;
BEGIN
    IF (job_waits_expire.max_jobs BETWEEN 1 AND 100000) IS NOT TRUE THEN
        PERFORM @schema@.fenced_refuse('expiring waits',
            'max_jobs must be from 1 to 100000, not '
            || coalesce(job_waits_expire.max_jobs::text, 'NULL'));
    END IF;
    WITH due AS (
        SELECT j.id FROM @schema@.jobs j
         WHERE j.status = 'suspended' AND j.wait_until <= now()
         ORDER BY j.wait_until
         LIMIT job_waits_expire.max_jobs
           FOR UPDATE SKIP LOCKED
    ), woken AS (
        UPDATE @schema@.jobs j
           SET status = 'pending', wait_ended = 'timeout', run_at = now(), updated_at = now()
          FROM due d
         WHERE j.id = d.id AND j.status = 'suspended'
        RETURNING j.id, j.queue, j.handler
    ), told AS (
        -- one wake-up per queue and handler, as notify_wake sends for an insert
        SELECT pg_notify(@schema_literal@ || '.wake',
                   CASE WHEN octet_length(w.queue) + octet_length(w.handler) <= 2048
                        THEN json_build_object('q', w.queue, 'h', w.handler,
                                               'id', min(w.id), 'n', count(*))
                        ELSE json_build_object('id', min(w.id), 'n', count(*)) END::text)
          FROM woken w
         GROUP BY w.queue, w.handler
    )
    SELECT (SELECT count(*) FROM woken) + 0 * (SELECT count(*) FROM told) INTO moved;
    RETURN moved;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.job_waits_expire(integer) FROM PUBLIC;

-- suspend (0028; raise pgworkerd.WaitFor): the holder's handler waits for signal
-- `signal_name` (a name like a handler's) for at most `timeout_seconds` (above 0, at most
-- 366 days), optionally under correlation key `wait_key` (signals.sql): the attempt is not
-- counted, the lease let go, progress and checkpoint saved (NULL keeps the old ones), and
-- the job is 'suspended' until signal_send or job_waits_expire makes it pending. A signal
-- of that name the job already has (sent before the wait) makes it pending at once
-- instead, its peers woken; a cancel requested meanwhile cancels it. The job's row is
-- locked before the signal is looked for, so a signal_send of the same job comes wholly
-- before or after (never lost in between). Returns the new status and the wait's end;
-- status 'refused' with `problem` when the key is held by another live job (nothing
-- changed: the caller records a failed attempt saying so); no row when the lease was lost.
-- For workers of other languages too (pgworkerd_daemon).
CREATE FUNCTION @schema@.job_suspend(
    job_id bigint, worker text, token bigint, signal_name text, timeout_seconds float8,
    wait_key text DEFAULT NULL, progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS TABLE (status text, wait_until timestamptz, problem text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text := @schema@.fenced_job_problem(job_suspend.worker, job_suspend.job_id,
                                                job_suspend.token);
    held record;
    holder bigint;
    signalled boolean;
    suspended record;
BEGIN
    IF problem IS NULL AND (job_suspend.signal_name IS NULL
                            OR NOT @schema@.enqueue_name_ok(job_suspend.signal_name)) THEN
        problem := 'signal_name must be 1 to 128 characters without control characters, '
                   || 'not beginning or ending with a space (like a handler''s name), not '
                   || coalesce(pg_catalog.quote_literal(left(job_suspend.signal_name, 200)),
                               'NULL');
    END IF;
    -- (NaN is above every number in PostgreSQL: refused too)
    IF problem IS NULL
       AND (job_suspend.timeout_seconds > 0
            AND job_suspend.timeout_seconds <= 31622400) IS NOT TRUE THEN
        problem := 'timeout_seconds must be above 0 and at most 31622400 (366 days), not '
                   || coalesce(job_suspend.timeout_seconds::text, 'NULL');
    END IF;
    IF problem IS NULL AND job_suspend.wait_key IS NOT NULL
       AND NOT @schema@.enqueue_name_ok(job_suspend.wait_key) THEN
        problem := 'wait_key must be NULL or 1 to 128 characters without control '
                   || 'characters, not ' || pg_catalog.quote_literal(left(job_suspend.wait_key, 200));
    END IF;
    IF problem IS NOT NULL THEN
        PERFORM @schema@.fenced_refuse('suspending a job', problem);
    END IF;
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    SELECT j.id INTO held FROM @schema@.jobs j
     WHERE j.id = job_suspend.job_id AND j.locked_by = job_suspend.worker
       AND j.lease_token = job_suspend.token AND j.status::text = 'running'
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;  -- the lease was lost: nothing changed
    END IF;
    IF job_suspend.wait_key IS NOT NULL THEN
        SELECT j.id INTO holder FROM @schema@.jobs j
         WHERE j.wait_key = job_suspend.wait_key AND j.id <> job_suspend.job_id
           AND j.status IN ('pending', 'waiting', 'suspended', 'running');
        IF holder IS NOT NULL THEN
            RETURN QUERY SELECT 'refused'::text, NULL::timestamptz,
                'WaitFor: correlation key ' || pg_catalog.quote_literal(job_suspend.wait_key)
                || ' is held by live job ' || holder || ' (a key names one live job)';
            RETURN;
        END IF;
    END IF;
    -- (a statement after the lock: it sees every signal committed before the lock came)
    signalled := EXISTS (SELECT FROM @schema@.signals s
                          WHERE s.job_id = job_suspend.job_id
                            AND s.name = job_suspend.signal_name);
    BEGIN
        UPDATE @schema@.jobs j
           SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                             WHEN signalled THEN 'pending'
                             ELSE 'suspended' END::@schema@.job_status,
               finished_at = CASE WHEN j.cancel_requested THEN now() END,
               run_at = CASE WHEN signalled AND NOT j.cancel_requested THEN now()
                             ELSE j.run_at END,
               attempts = j.attempts - 1,
               wait_for = job_suspend.signal_name,
               wait_since = now(),
               wait_until = now() + make_interval(secs => job_suspend.timeout_seconds),
               wait_key = job_suspend.wait_key,
               wait_ended = CASE WHEN signalled THEN 'signal' END,
               progress = coalesce(job_suspend.progress, j.progress),
               checkpoint = coalesce(job_suspend.checkpoint, j.checkpoint),
               locked_by = NULL, locked_until = NULL, cancel_requested = false,
               updated_at = now()
         WHERE j.id = job_suspend.job_id
        RETURNING j.status::text AS status, j.wait_until, j.queue, j.handler INTO suspended;
    EXCEPTION WHEN unique_violation THEN
        -- another job took the key since the look above (jobs_wait_key_live_idx)
        RETURN QUERY SELECT 'refused'::text, NULL::timestamptz,
            'WaitFor: correlation key ' || pg_catalog.quote_literal(job_suspend.wait_key)
            || ' is held by another live job (a key names one live job)';
        RETURN;
    END;
    IF suspended.status = 'pending' THEN
        PERFORM pg_notify(@schema_literal@ || '.wake',
            CASE WHEN octet_length(suspended.queue) + octet_length(suspended.handler) <= 2048
                 THEN json_build_object('q', suspended.queue, 'h', suspended.handler,
                                        'id', job_suspend.job_id, 'n', 1)
                 ELSE json_build_object('id', job_suspend.job_id, 'n', 1) END::text);
    END IF;
    RETURN QUERY SELECT suspended.status, suspended.wait_until, NULL::text;
END;
$$;

REVOKE EXECUTE ON FUNCTION
    @schema@.job_suspend(bigint, text, bigint, text, float8, text, jsonb, jsonb)
    FROM PUBLIC;

-- A rolling upgrade without a window, as in 0024: the roles that may claim today (EXECUTE
-- on claim_jobs: pgworkerd_daemon of roles.sql, whatever it is named) get what the
-- daemon of this release calls (job_suspend, job_waits_expire, the signals and wait
-- columns it reads), and the roles that may enqueue (EXECUTE on enqueue_many_v2) may
-- signal. The schema owner needs no grant.
DO $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT r.rolname
          FROM pg_catalog.pg_proc p, LATERAL pg_catalog.aclexplode(p.proacl) a
          JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
         WHERE p.oid = '@schema@.claim_jobs(text, text[], text[], float8[], integer[], integer, '
                       'integer[], jsonb, integer[], integer[])'::regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
    LOOP
        EXECUTE pg_catalog.format(
            'GRANT EXECUTE ON FUNCTION '
            '@schema@.job_suspend(bigint, text, bigint, text, float8, text, jsonb, jsonb), '
            '@schema@.job_waits_expire(integer) TO %I', grantee);
        EXECUTE pg_catalog.format('GRANT SELECT ON @schema@.signals TO %I', grantee);
        EXECUTE pg_catalog.format(
            'GRANT SELECT (wait_for, wait_since, wait_until, wait_key, wait_ended) '
            'ON @schema@.jobs TO %I', grantee);
    END LOOP;
    FOR grantee IN
        SELECT DISTINCT r.rolname
          FROM pg_catalog.pg_proc p, LATERAL pg_catalog.aclexplode(p.proacl) a
          JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
         WHERE p.oid = '@schema@.enqueue_many_v2(jsonb)'::regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
    LOOP
        EXECUTE pg_catalog.format(
            'GRANT EXECUTE ON FUNCTION @schema@.signal_send(bigint, text, jsonb), '
            '@schema@.signal_send_by_key(text, text, jsonb) TO %I', grantee);
    END LOOP;
END
$$;

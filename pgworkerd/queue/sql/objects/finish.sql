-- Renewing and finishing claimed jobs: the fenced functions the daemon role changes jobs
-- through. SECURITY DEFINER, so the daemon role needs no UPDATE on jobs (roles.sql does
-- not grant it): every change of status, attempts, checkpoint or result is one of these,
-- each fenced by the lease (the job's worker and token, and status running), and EXECUTE
-- is revoked from PUBLIC (roles.sql grants it to pgworkerd_daemon). Each forces a durable
-- commit (synchronous_commit on for the transaction) and finds jobs by primary key.
-- A lost lease changes nothing, and each function says so.
--
-- For workers in any language (README "Jobs"): renew_lease, complete_job, fail_job,
-- release_job, snooze_job, give_up_job, one job each (tests/integration/test_sql_finish.py
-- holds them equal to the daemon's statements). For the daemon, many jobs per call:
-- renew_leases, complete_jobs; and cancel_held_job, snooze_held_job.

-- Renew a lease for lease_seconds more, saving progress and a checkpoint (NULL keeps the
-- saved ones). No row: the lease was lost, stop the job. cancel_requested: stop the job
-- and record the attempt with fail_job (it then becomes cancelled).
CREATE FUNCTION @schema@.renew_lease(
    job_id bigint, worker text, token bigint, lease_seconds float8,
    progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS TABLE (cancel_requested boolean, locked_until timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
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
SECURITY DEFINER
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
SECURITY DEFINER
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
SECURITY DEFINER
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
SECURITY DEFINER
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
SECURITY DEFINER
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

REVOKE EXECUTE ON FUNCTION
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

REVOKE EXECUTE ON FUNCTION
    @schema@.renew_leases(text, bigint[], bigint[], float8[], jsonb[], jsonb[]),
    @schema@.complete_jobs(text, bigint[], bigint[], jsonb[], jsonb[]),
    @schema@.cancel_held_job(bigint, text, bigint, text, jsonb),
    @schema@.snooze_held_job(bigint, text, bigint, float8, integer, jsonb, jsonb)
    FROM PUBLIC;

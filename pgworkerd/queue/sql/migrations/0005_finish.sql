-- 0005: finishing a claimed job from SQL, for workers in any language: renew_lease,
-- complete_job, fail_job and release_job. They do what the daemon's own statements in
-- sql/queries.sql do for one job (tests/test_sql_finish.py holds them equal).
-- Each names the lease: the job's id, the worker name given to claim() and the
-- lease_token it returned. A lost lease (the job ran out of time and was claimed
-- elsewhere, or it was finished already) changes nothing, and the function says so.
-- SECURITY INVOKER: the caller needs pgworkerd_daemon's rights on the jobs table.

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
    RETURN QUERY
    UPDATE @schema@.jobs j
       SET locked_until = now() + make_interval(secs => renew_lease.lease_seconds),
           progress = coalesce(renew_lease.progress, j.progress),
           checkpoint = coalesce(renew_lease.checkpoint, j.checkpoint),
           updated_at = now()
     WHERE j.id = renew_lease.job_id AND j.locked_by = renew_lease.worker
       AND j.lease_token = renew_lease.token AND j.status = 'running'
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
    UPDATE @schema@.jobs j
       SET status = 'completed', result = complete_job.result,
           progress = coalesce(complete_job.progress, j.progress),
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           finished_at = now(), updated_at = now()
     WHERE j.id = complete_job.job_id AND j.locked_by = complete_job.worker
       AND j.lease_token = complete_job.token AND j.status = 'running';
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
       AND j.lease_token = fail_job.token AND j.status = 'running'
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
       AND j.lease_token = release_job.token AND j.status = 'running'
    RETURNING j.status::text INTO new_status;
    RETURN new_status;
END;
$$;

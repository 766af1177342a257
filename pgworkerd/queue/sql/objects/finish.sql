-- Renewing and finishing claimed jobs: the fenced functions the daemon role changes jobs
-- through, one text per transition (0025), which the daemon and workers in other
-- languages both call:
--
--   transition  the one text        other languages call         the daemon's statement
--   renew       renew_leases        renew_lease (one lease)      job_renew
--   complete    complete_jobs       complete_job (one job)       job_complete(_one)
--   fail        fail_job            fail_job                     job_fail
--   release     release_job         release_job                  job_release
--   snooze      snooze_held_job     snooze_job (+ fail_job past  job_snooze
--                                   max_snoozes)
--   give up     give_up_job         give_up_job                  job_bury
--   cancel      cancel_held_job     (the daemon's only)          job_cancel_running
--
-- (The claim, claim_jobs, is in claim.sql.) SECURITY DEFINER, so the daemon role needs no
-- UPDATE on jobs (roles.sql does not grant it): every change of status, attempts,
-- checkpoint or result is one of these, each fenced by the lease (the job's worker and
-- token, and status running), and EXECUTE is revoked from PUBLIC (roles.sql grants it).
-- Each forces a durable commit (synchronous_commit on for the transaction), finds jobs
-- by primary key (the status compared as text), and refuses hostile arguments with 22023
-- before anything changes (the checks below). A lost lease changes nothing, and each
-- function says so. tests/integration/test_sql_finish.py holds both paths equal.

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

-- renew for one lease (other languages): renew_leases for one job. One row if the lease
-- held (cancel_requested: stop the job; locked_until: the new end), none if it was lost.
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
    RETURN QUERY
    SELECT r.cancel_requested, r.locked_until
      FROM @schema@.renew_leases(renew_lease.worker, ARRAY[renew_lease.job_id],
                                 ARRAY[renew_lease.token], ARRAY[renew_lease.lease_seconds],
                                 ARRAY[renew_lease.progress], ARRAY[renew_lease.checkpoint]) r
     WHERE r.renewed;
END;
$$;

-- complete for one job (other languages, and the daemon's job_complete_one):
-- complete_jobs for one job. True if the lease held.
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
    RETURN EXISTS (
        SELECT FROM @schema@.complete_jobs(complete_job.worker, ARRAY[complete_job.job_id],
                                           ARRAY[complete_job.token],
                                           ARRAY[complete_job.result],
                                           ARRAY[complete_job.progress]));
END;
$$;

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

-- release: hand a held job back (drain, hand-back, shutdown) without counting the
-- attempt: pending at once and in its old place in the queue (run_at kept), or cancelled
-- if a cancel was requested; its progress and checkpoint saved (NULL keeps the old ones).
-- The peers that serve it are woken on commit as for a new job (the wake channel's
-- {"q", "h", "id", "n"}, daemon/peers.py), so another daemon starts it at once. Returns
-- the new status; NULL: the lease was lost and nothing changed.
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
        PERFORM @schema@.workers_wake(released.queue, released.handler, release_job.job_id,
                                      1, 0, 0);
    END IF;
    RETURN released.status;
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

-- give up (and the daemon's burial of a job it cannot run): dead at once, whatever
-- attempts are left, with the reason. True if the lease held.
CREATE FUNCTION @schema@.give_up_job(job_id bigint, worker text, token bigint, reason text)
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

REVOKE EXECUTE ON FUNCTION
    @schema@.renew_lease(bigint, text, bigint, float8, jsonb, jsonb),
    @schema@.complete_job(bigint, text, bigint, jsonb, jsonb),
    @schema@.fail_job(bigint, text, bigint, text, float8, float8, jsonb, jsonb),
    @schema@.release_job(bigint, text, bigint, jsonb, jsonb),
    @schema@.snooze_job(bigint, text, bigint, float8, integer, jsonb, jsonb),
    @schema@.give_up_job(bigint, text, bigint, text)
    FROM PUBLIC;

-- renew: many leases of one worker at once (the daemon's job_renew), each renewed with
-- its progress and checkpoint (NULL keeps the old value), or reported lost.
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

-- complete: jobs their holder still owns (the daemon's job_complete), each with an
-- optional result; returns the ids completed (a missing one lost its lease).
CREATE FUNCTION @schema@.complete_jobs(
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

-- cancel: the holder stopped a job whose cancellation was requested: cancelled, with the
-- reason and its latest progress (NULL keeps the old value). Returns 'cancelled', or
-- NULL when the lease was lost.
CREATE FUNCTION @schema@.cancel_held_job(
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

REVOKE EXECUTE ON FUNCTION
    @schema@.renew_leases(text, bigint[], bigint[], float8[], jsonb[], jsonb[]),
    @schema@.complete_jobs(text, bigint[], bigint[], jsonb[], jsonb[]),
    @schema@.cancel_held_job(bigint, text, bigint, text, jsonb),
    @schema@.snooze_held_job(bigint, text, bigint, float8, integer, jsonb, jsonb)
    FROM PUBLIC;

-- suspend (0028; raise pgworkerd.WaitFor): the holder's handler waits for signal
-- `signal_name` (a name like a handler's) for at most `timeout_seconds` (above 0, at most
-- 366 days), optionally under correlation key `wait_key` (signals.sql): the attempt is not
-- counted, the lease let go, progress and checkpoint saved (NULL keeps the old ones), and
-- the job is 'suspended' until signal_send or job_waits_expire makes it pending. A signal
-- of that name the job already has (sent before the wait) makes it pending at once
-- instead, its peers woken; a cancel requested meanwhile cancels it. The job's row is
-- locked before the signal is looked for, so a signal_send of the same job comes wholly
-- before or after (never lost in between). With a key (0032), the signals parked under it
-- by logins that may read the job (signal_send_by_key_v2) become the job's own first (the
-- job's own signal of a name wins over a parked one), under the key's transaction lock,
-- taken before the row's (signal_send_by_key_v2 takes the key's, then the row's). Returns the new status and the wait's end;
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
    IF job_suspend.wait_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtext(@schema_literal@ || '.wait_key'),
                                      hashtext(job_suspend.wait_key));
    END IF;
    SELECT j.id, j.enqueued_by INTO held FROM @schema@.jobs j
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
    BEGIN
        IF job_suspend.wait_key IS NOT NULL THEN
            -- signals parked under the key by a login that may read this job, the first
            -- of each name, become the job's
            WITH adopted AS (
                DELETE FROM @schema@.parked_signals p
                 WHERE p.wait_key = job_suspend.wait_key
                   AND p.sent_at > now() - interval '7 days'
                   AND (p.sent_by = held.enqueued_by
                        OR CASE WHEN EXISTS (SELECT FROM pg_roles r WHERE r.rolname = p.sent_by)
                                THEN has_any_column_privilege(p.sent_by, '@schema@.jobs',
                                                              'SELECT')
                                ELSE false END)
                RETURNING p.name, p.payload, p.sent_at, p.sent_by
            )
            INSERT INTO @schema@.signals AS s (job_id, name, payload, sent_at, sent_by)
            SELECT DISTINCT ON (a.name) job_suspend.job_id, a.name, a.payload, a.sent_at,
                   a.sent_by
              FROM adopted a
             ORDER BY a.name, a.sent_at
            ON CONFLICT ON CONSTRAINT signals_pkey DO NOTHING;
        END IF;
        -- (a statement after the locks: it sees every signal committed before they came)
        signalled := EXISTS (SELECT FROM @schema@.signals s
                              WHERE s.job_id = job_suspend.job_id
                                AND s.name = job_suspend.signal_name);
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
        PERFORM @schema@.workers_wake(suspended.queue, suspended.handler, job_suspend.job_id,
                                      1, 0, 0);
    END IF;
    RETURN QUERY SELECT suspended.status, suspended.wait_until, NULL::text;
END;
$$;

REVOKE EXECUTE ON FUNCTION
    @schema@.job_suspend(bigint, text, bigint, text, float8, text, jsonb, jsonb)
    FROM PUBLIC;

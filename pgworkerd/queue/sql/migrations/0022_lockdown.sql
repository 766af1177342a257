-- The daemon role does what a daemon does and no more (issue 22, N4 and N9).
-- compatible-with-code-of-schema: 5
--
-- An expand migration for the schema (README "Upgrading"): functions are added, the claim
-- and finishing functions become SECURITY DEFINER with EXECUTE revoked from PUBLIC, a
-- retention floor (one row, 1 day) guards prune_finished_v2. Older daemons keep running
-- after `pgworkerd migrate`: they UPDATE jobs with the rights roles.sql gave them.
--
-- The upgrade path, without a window: roles that may UPDATE jobs.lease_token (the daemon
-- role of an earlier roles.sql) are granted the new functions at the end of this
-- migration, so old and new daemons run side by side. roles.sql of this release then
-- takes from pgworkerd_daemon the column UPDATE on jobs, INSERT/UPDATE on job_logs,
-- UPDATE on attempts, schedule_declare, schedule_fire and prune_finished_v1. So:
--   1. `pgworkerd migrate` (daemons of every release keep running, workers in other
--      languages too);
--   2. roll every daemon to this release (they still declare their schedules: the old
--      grants let them);
--   3. an operator declares the schedules of every daemon's config, as
--      pgworkerd_operator: `pgworkerd --config d.toml schedules declare` (it is so
--      already when step 2 ran, unless a config changed since);
--   4. re-apply roles.sql. What breaks then: a daemon of an older release still running
--      fails every claim, finish, log write and schedule fire with "permission denied"
--      (its running jobs are retried after their lease), and a daemon of this release
--      whose config has a schedule no operator declared (or declared otherwise) logs
--      that and does not fire it. A daemon whose [retention] keeps finished jobs under a
--      day is refused its prune (logged) until an operator lowers the floor:
--      SELECT pgworkerd.retention_floor_set(seconds).

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

-- Schedules an operator declared, fired by name and tick: the job is built from the
-- stored definition (the enqueue_many job object of config.ScheduleConfig.job: handler,
-- payload, queue, priority, max_attempts; keys holding null left out) and so is its
-- overlap policy; schedule_declare (0010) is the operator's (`pgworkerd schedules
-- declare`). The tick is the caller's (only a finite one): a daemon role may fire a
-- declared schedule's stored job at ticks of its choosing, never another job.
CREATE FUNCTION @schema@.schedule_fire_v2(
    name text, tick timestamptz, worker text, OUT outcome text, OUT job_id bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    stored @schema@.schedules;
    job jsonb;
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

-- prune_finished_v2 (0020) behind the floor: unchanged but for the check after the
-- argument checks (same name, arguments and grants, so daemons of schemas 20 and 21 call
-- it as before).
CREATE OR REPLACE FUNCTION @schema@.prune_finished_v2(
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

-- A rolling upgrade without a window: the roles that may rewrite a job's lease today
-- (UPDATE of jobs.lease_token: pgworkerd_daemon under an earlier roles.sql, whatever it
-- is named) get EXECUTE on what the daemon role of this release calls, now. So daemons
-- of the previous release (their UPDATEs) and of this one (these functions), and workers
-- in other languages (claim_jobs, the finishing functions), all run until roles.sql is
-- applied again, which takes the old rights away. The schema owner needs no grant. (A
-- fresh schema has no such role: schema.sql has nothing to copy.)
DO $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT p.grantee::text
          FROM information_schema.column_privileges p
         WHERE p.table_schema = @schema_literal@ AND p.table_name = 'jobs'
           AND p.column_name = 'lease_token' AND p.privilege_type = 'UPDATE'
           AND p.grantee::text <> 'PUBLIC'
           AND p.grantee::text <> (SELECT r.rolname FROM pg_catalog.pg_roles r
                                   JOIN pg_catalog.pg_class c ON c.relowner = r.oid
                                  WHERE c.oid = '@schema@.jobs'::regclass)
    LOOP
        EXECUTE pg_catalog.format(
            'GRANT EXECUTE ON FUNCTION '
            '@schema@.claim_jobs(text, text[], text[], float8[], integer[], integer, '
            'integer[], jsonb, integer[], integer[]), '
            '@schema@.renew_lease(bigint, text, bigint, float8, jsonb, jsonb), '
            '@schema@.complete_job(bigint, text, bigint, jsonb, jsonb), '
            '@schema@.fail_job(bigint, text, bigint, text, float8, float8, jsonb, jsonb), '
            '@schema@.release_job(bigint, text, bigint, jsonb, jsonb), '
            '@schema@.snooze_job(bigint, text, bigint, float8, integer, jsonb, jsonb), '
            '@schema@.give_up_job(bigint, text, bigint, text), '
            '@schema@.renew_leases(text, bigint[], bigint[], float8[], jsonb[], jsonb[]), '
            '@schema@.complete_jobs(text, bigint[], bigint[], jsonb[], jsonb[]), '
            '@schema@.cancel_held_job(bigint, text, bigint, text, jsonb), '
            '@schema@.snooze_held_job(bigint, text, bigint, float8, integer, jsonb, jsonb), '
            '@schema@.job_log_write_v1(text, bigint[], bigint[], integer[], text[], text[], '
            'bigint[], bigint[], boolean[]), '
            '@schema@.attempt_account_v1(text, bigint[], bigint[], float8[], float8[], '
            'float8[], bigint[]), '
            '@schema@.schedule_fire_v2(text, timestamptz, text) TO %I', grantee);
    END LOOP;
END
$$;

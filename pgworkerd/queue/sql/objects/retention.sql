-- The fleet's own retention: the floor an operator sets, and prune_finished_v2, which
-- deletes old finished jobs, schedule runs and gone daemons in batches (prune_finished_v1
-- is in compat.sql).

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

-- The fleet's retention, version 2: prune_finished_v1 (0014) plus old schedule runs and
-- the registry rows of daemons gone long ago, each bounded by p_batch rows per call
-- (1..10000 per table, so a call deletes at most 3 * p_batch rows, each table's rows
-- oldest first, FOR UPDATE SKIP LOCKED, in the caller's one short transaction).
-- Retentions in seconds; NULL keeps that kind forever.
--
-- Schedule runs (p_schedule_runs, by tick) keep, of each schedule, its latest run (the
-- point catch-up counts from: schedule_declare) and every run from the oldest of its
-- latest 100 runs that created a job still pending or running (schedule_fire's overlap
-- check finds the job in the way through that run; the same rule as `pgworkerd prune`).
-- Each schedule's runs through the primary key (schedule, tick): one probe for a
-- schedule with nothing old, no scan of the table.
-- Daemons (p_gone_daemons): rows of state 'gone' whose stop (or last heartbeat, when it
-- was marked gone by a peer) is older than the retention; a live daemon's row is never
-- touched, and a daemon that comes back after a long outage registers anew.
--
-- Returns deleted (finished jobs), schedule_runs_deleted, daemons_deleted (all NULL when
-- another caller holds the retention lock: it is pruning) and live_daemons.
CREATE FUNCTION @schema@.prune_finished_v2(
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

    -- A parent stays while one of its children has not finished (schema 27): the child
    -- reads its parents' results at each claim, and show and explain name them.
    -- A batch's member stays while its batch's callback has not finished (schema 30):
    -- the callback reads the members' outcomes when it starts (batches.sql).
    -- A job stays while it holds its dedupe key (schema 34: its window has not passed).
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
                      AND NOT (dedupe_window_seconds IS NOT NULL
                               AND finished_at + make_interval(secs => dedupe_window_seconds)
                                   > now())
                      AND NOT (has_children AND @schema@.job_children_unfinished(id))
                      AND NOT (batch_id IS NOT NULL
                               AND @schema@.batch_callback_unfinished(batch_id))
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
                      AND NOT (dedupe_window_seconds IS NOT NULL
                               AND finished_at + make_interval(secs => dedupe_window_seconds)
                                   > now())
                      AND NOT (has_children AND @schema@.job_children_unfinished(id))
                      AND NOT (batch_id IS NOT NULL
                               AND @schema@.batch_callback_unfinished(batch_id))
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
                      AND NOT (dedupe_window_seconds IS NOT NULL
                               AND finished_at + make_interval(secs => dedupe_window_seconds)
                                   > now())
                      AND NOT (has_children AND @schema@.job_children_unfinished(id))
                      AND NOT (batch_id IS NOT NULL
                               AND @schema@.batch_callback_unfinished(batch_id))
                    ORDER BY finished_at
                    LIMIT p_batch - deleted
                    FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS n = ROW_COUNT;
        deleted := deleted + n;
    END IF;

    -- Dedupe windows (0034): release, oldest first, up to p_batch keys that finished jobs
    -- hold past their windows (an enqueue of such a key releases it itself: this sweep
    -- only keeps the unique index to the keys actually held).
    UPDATE @schema@.jobs
       SET dedupe_window_seconds = NULL
     WHERE id = ANY (ARRAY(
               SELECT h.id FROM @schema@.jobs h
                WHERE h.finished_at IS NOT NULL AND h.dedupe_window_seconds IS NOT NULL
                  AND h.finished_at + make_interval(secs => h.dedupe_window_seconds) <= now()
                ORDER BY h.finished_at
                LIMIT p_batch
                FOR UPDATE SKIP LOCKED));

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

REVOKE EXECUTE ON FUNCTION @schema@.prune_finished_v2(float8, float8, float8, float8, float8,
                                                      integer) FROM PUBLIC;

-- The daemons' expiry sweep (0032; daemon/sweeps.EXPIRY, spaced across the fleet
-- like stale-marking): jobs past their expires_at end as 'cancelled' with the reason in
-- last_error ("expired: ..."), so that a job whose handler no daemon serves, or a queue
-- nobody claims from, ends at its deadline too: pending ones, and running ones whose
-- lease ran out (a rescue would start a new attempt). The one text of that transition:
-- claim_jobs_v2 and claim_jobs_v3 call it (with 1000) before they claim (0039);
-- claim_jobs_v3 only when a probe of its two WHERE conditions finds a job (0043: change
-- them there too). At most
-- `max_jobs` of each per call, oldest deadline (or lease) first; rows
-- another transaction holds (a claim, a cancel) are skipped, never waited for. Returns
-- how many ended. Their end counts for their batches and children as any cancel does.
-- SECURITY DEFINER: the daemon role has no UPDATE on jobs.
CREATE FUNCTION @schema@.job_expired_cancel(max_jobs integer)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    pending_ended integer;
    running_ended integer;
BEGIN
    IF (job_expired_cancel.max_jobs BETWEEN 1 AND 100000) IS NOT TRUE THEN
        PERFORM @schema@.fenced_refuse('ending expired jobs',
            'max_jobs must be from 1 to 100000, not '
            || coalesce(job_expired_cancel.max_jobs::text, 'NULL'));
    END IF;
    UPDATE @schema@.jobs j
       SET status = 'cancelled', finished_at = now(), updated_at = now(),
           last_error = 'expired: not started by its expires_at ' || j.expires_at
      FROM (SELECT e.id FROM @schema@.jobs e
             WHERE e.status = 'pending' AND e.expires_at <= now()
             ORDER BY e.expires_at
             LIMIT job_expired_cancel.max_jobs
               FOR UPDATE SKIP LOCKED) AS expired
     WHERE j.id = expired.id;
    GET DIAGNOSTICS pending_ended = ROW_COUNT;
    UPDATE @schema@.jobs j
       SET status = 'cancelled', finished_at = now(), updated_at = now(),
           locked_by = NULL, locked_until = NULL,
           last_error = 'expired: its lease ran out after its expires_at ' || j.expires_at
                        || '; not started again'
      FROM (SELECT e.id FROM @schema@.jobs e
             WHERE e.status = 'running' AND e.locked_until < now()
               AND e.expires_at <= now()
             ORDER BY e.locked_until
             LIMIT job_expired_cancel.max_jobs
               FOR UPDATE SKIP LOCKED) AS expired
     WHERE j.id = expired.id;
    GET DIAGNOSTICS running_ended = ROW_COUNT;
    RETURN pending_ended + running_ended;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.job_expired_cancel(integer) FROM PUBLIC;

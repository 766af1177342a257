-- Upkeep (issue 21): retry resets snoozes, retention of schedule runs and gone daemons.
-- compatible-with-code-of-schema: 5
--
-- An expand migration (README "Upgrading"): one new index and one new function; nothing
-- existing changes, so older daemons run on (calling prune_finished_v1, which keeps
-- working and takes the same lock as v2, so old and new daemons never prune at once).
-- (`retry` resetting the snooze count is a change of the statement in queries.sql.)
--
-- Finished jobs by status and finish time, for retention. With the default mixed
-- retentions (completed 7 days, dead 30 days) the dead jobs between 7 and 30 days old are
-- kept; through jobs_finished_at_idx alone a batch of completed jobs read past every one
-- of them (oldest first, status checked row by row) before finding a completed one, each
-- batch again (bench/retention_cost.py: ~11 k buffers and ~40 ms a batch with 200,000
-- kept dead jobs). Through this index a batch reads only the rows it deletes.
-- It costs one entry per finished row version (a job's finish; a pending or running row
-- has no finished_at). On a large table build it beforehand without blocking writes:
--     CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_status_finished_at_idx
--         ON pgworkerd.jobs (status, finished_at) WHERE finished_at IS NOT NULL;
-- then migrate: IF NOT EXISTS makes the migration skip it.
CREATE INDEX IF NOT EXISTS jobs_status_finished_at_idx ON @schema@.jobs (status, finished_at)
    WHERE finished_at IS NOT NULL;

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
    retention float8[] := ARRAY[p_completed, p_cancelled, p_dead];
    statuses @schema@.job_status[] := ARRAY['completed', 'cancelled', 'dead'];
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
    IF EXISTS (SELECT 1
                 FROM unnest(ARRAY[p_completed, p_cancelled, p_dead, p_schedule_runs,
                                   p_gone_daemons]) r
                WHERE r < 0 OR r = 'NaN'::float8 OR r = 'Infinity'::float8) THEN
        RAISE EXCEPTION 'prune_finished_v2: a retention must be a finite number of seconds >= 0'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT count(*) INTO live_daemons FROM @schema@.workers WHERE state <> 'gone';
    IF NOT pg_try_advisory_xact_lock(
            hashtextextended('pgworkerd.retention:' || @schema_literal@, 0)) THEN
        RETURN;  -- the counts stay NULL: another daemon is pruning
    END IF;

    deleted := 0;
    FOR i IN 1..3 LOOP
        CONTINUE WHEN retention[i] IS NULL OR deleted >= p_batch;
        -- jobs_status_finished_at_idx: this status's oldest only
        DELETE FROM @schema@.jobs
         WHERE id IN (SELECT id FROM @schema@.jobs
                       WHERE status = statuses[i]
                         AND finished_at < now() - make_interval(secs => retention[i])
                       ORDER BY finished_at
                       LIMIT p_batch - deleted
                       FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS n = ROW_COUNT;
        deleted := deleted + n;
    END LOOP;

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
               AND r.tick IN (SELECT o.tick FROM @schema@.schedule_runs o
                               WHERE o.schedule = schedule_name AND o.tick < keep_from
                               ORDER BY o.tick
                               LIMIT p_batch - schedule_runs_deleted
                               FOR UPDATE SKIP LOCKED);
            GET DIAGNOSTICS n = ROW_COUNT;
            schedule_runs_deleted := schedule_runs_deleted + n;
        END LOOP;
    END IF;

    daemons_deleted := 0;
    IF p_gone_daemons IS NOT NULL THEN
        DELETE FROM @schema@.workers
         WHERE id IN (SELECT w.id FROM @schema@.workers w
                       WHERE w.state = 'gone'
                         AND coalesce(w.stopped_at, w.heartbeat_at)
                             < now() - make_interval(secs => p_gone_daemons)
                       ORDER BY coalesce(w.stopped_at, w.heartbeat_at)
                       LIMIT p_batch
                       FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS daemons_deleted = ROW_COUNT;
    END IF;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.prune_finished_v2(float8, float8, float8, float8, float8,
                                                      integer) FROM PUBLIC;

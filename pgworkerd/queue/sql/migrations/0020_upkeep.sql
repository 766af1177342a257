-- Upkeep (issue 21): retry resets snoozes, retention of schedule runs and gone daemons.
-- compatible-with-code-of-schema: 5
--
-- An expand migration (README "Upgrading"): three new indexes and one new function; nothing
-- existing changes, so older daemons run on (calling prune_finished_v1, which keeps
-- working and takes the same lock as v2, so old and new daemons never prune at once).
-- (`retry` resetting the snooze count is a change of the statement in queries.sql.)
--
-- Finished jobs of each final status by finish time, for retention. With the default
-- mixed retentions (completed 7 days, dead 30 days) the dead jobs between 7 and 30 days
-- old are kept, and they finished before the completed jobs that have just turned 7 days
-- old. Through jobs_finished_at_idx (oldest first, the status checked row by row) every
-- batch of completed jobs read all those kept dead jobs first, each batch again
-- (bench/retention_cost.py). A partial index per status holds only that status's rows,
-- so a batch reads the rows it deletes and stops. (One index on (status, finished_at)
-- does not do: the planner prefers jobs_finished_at_idx, whose order follows the heap's,
-- and so walks the kept rows all the same.) Each finished row version is in one of them
-- (a pending or running job is in none): together they cost about one index.
-- On a large table build them beforehand without blocking writes, e.g.
--     CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_completed_finished_at_idx
--         ON pgworkerd.jobs (finished_at) WHERE status = 'completed';
-- (and so for cancelled and dead), then migrate: IF NOT EXISTS skips what is there.
CREATE INDEX IF NOT EXISTS jobs_completed_finished_at_idx ON @schema@.jobs (finished_at)
    WHERE status = 'completed';
CREATE INDEX IF NOT EXISTS jobs_cancelled_finished_at_idx ON @schema@.jobs (finished_at)
    WHERE status = 'cancelled';
CREATE INDEX IF NOT EXISTS jobs_dead_finished_at_idx ON @schema@.jobs (finished_at)
    WHERE status = 'dead';

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

REVOKE EXECUTE ON FUNCTION @schema@.prune_finished_v2(float8, float8, float8, float8, float8,
                                                      integer) FROM PUBLIC;

-- Periodic jobs (issue 11): the schedules daemons declare, and one row per fired tick.
-- compatible-with-code-of-schema: 5
--
-- An expand migration (README "Upgrading"): two new tables, three new functions and a
-- column of workers with a default; nothing existing changes, so older daemons run on
-- as before (they fire no schedules).
--
-- Exactly one job per tick across the fleet, without a leader: every daemon that declares
-- a schedule calls schedule_fire for each of its ticks; the first to insert the
-- (schedule, tick) row creates the job in the same transaction, the others find the row.

-- One row per schedule name: its definition as a daemon last declared it (daemons
-- declare theirs at start and after each reconnect; during a deploy the last one wins).
CREATE TABLE @schema@.schedules (
    name        text PRIMARY KEY CHECK (@schema@.enqueue_name_ok(name)),
    definition  jsonb NOT NULL CHECK (jsonb_typeof(definition) = 'object'),
    declared_by text NOT NULL,
    declared_at timestamptz NOT NULL DEFAULT now(),
    -- ticks after this are the schedule's: a new schedule does not fire its past
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per tick handled: the job it created, or why it created none. No foreign key
-- to jobs: finished jobs are pruned on their own schedule.
CREATE TABLE @schema@.schedule_runs (
    schedule text NOT NULL REFERENCES @schema@.schedules (name) ON DELETE CASCADE,
    tick     timestamptz NOT NULL,
    job_id   bigint,
    skipped  text,
    fired_by text NOT NULL,
    fired_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, tick),
    CONSTRAINT schedule_runs_job_or_reason CHECK ((job_id IS NULL) <> (skipped IS NULL))
);

-- Which schedules each daemon declares: `pgworkerd schedules` shows whether a live daemon
-- declares a schedule now (a schedule removed from every config stops firing).
ALTER TABLE @schema@.workers ADD COLUMN schedules text[] NOT NULL DEFAULT '{}';

-- The overlap check reads a schedule's latest runs that created a job.
CREATE INDEX schedule_runs_jobs_idx ON @schema@.schedule_runs (schedule, tick DESC)
    WHERE job_id IS NOT NULL;

-- Record a daemon's definition of a schedule; returns the tick up to which the schedule
-- is handled: its latest run, or when it was first declared.
CREATE FUNCTION @schema@.schedule_declare(name text, definition jsonb, worker text)
RETURNS timestamptz
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO @schema@.schedules AS s (name, definition, declared_by)
    VALUES (schedule_declare.name, schedule_declare.definition, schedule_declare.worker)
    ON CONFLICT (name) DO UPDATE
        SET definition = excluded.definition, declared_by = excluded.declared_by,
            declared_at = now()
    RETURNING greatest(s.created_at,
                       (SELECT max(r.tick) FROM @schema@.schedule_runs r
                         WHERE r.schedule = s.name));
$$;

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
    job_id := (@schema@.enqueue_many(jsonb_build_array(job)))[1];
    INSERT INTO @schema@.schedule_runs (schedule, tick, job_id, fired_by)
    VALUES (name, tick, schedule_fire.job_id, worker);
    outcome := 'fired';
END;
$$;

-- Delete run rows older than `older_than`, keeping each schedule's latest (its last run
-- and the point catch-up counts from); returns how many.
CREATE FUNCTION @schema@.schedule_runs_prune(older_than interval)
RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH deleted AS (
        DELETE FROM @schema@.schedule_runs r
         WHERE r.fired_at < now() - older_than
           AND r.tick < (SELECT max(l.tick) FROM @schema@.schedule_runs l
                          WHERE l.schedule = r.schedule)
        RETURNING 1
    )
    SELECT count(*) FROM deleted;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.schedule_declare(text, jsonb, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION @schema@.schedule_fire(text, timestamptz, jsonb, text, text)
    FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION @schema@.schedule_runs_prune(interval) FROM PUBLIC;

-- Periodic jobs (0010): the schedules daemons declare, the runs they fire, and the
-- functions that declare, fire and prune them (schedule_fire_v2 fires a tick from the
-- stored definition; schedule_fire, which took the job from its caller, is in
-- compat.sql). See migration 0010 for how one job per tick is kept.

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

REVOKE EXECUTE ON FUNCTION @schema@.schedule_runs_prune(interval) FROM PUBLIC;

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

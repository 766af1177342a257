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

-- Schedules: whether a cron expression (5 fields, or 6 with seconds first, as cronsim
-- reads them: numbers, names, *, ?, ranges, steps, lists; Sunday 0 or 7) produces the
-- instant `at` in time zone `zone`. A field using cronsim's L, W or # is not checked here
-- (it matches every value): such a schedule's ticks are held to the other fields and to
-- schedule_fire_v2's window only. In a zone's spring-forward gap cronsim fires a skipped
-- wall time when the clocks jump: at a jump, the hour before counts, any minute. A wall
-- time repeated when the clocks go back matches at both instants (cronsim fires the
-- first only).
CREATE FUNCTION @schema@.cron_field_matches(field text, value integer, low integer,
                                            high integer, names text[])
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    item text;
    parts text[];
    bounds text[];
    step integer;
    lo integer;
    hi integer;
BEGIN
    IF field ~* '[LW#]' THEN
        RETURN true;
    END IF;
    FOREACH item IN ARRAY string_to_array(upper(field), ',') LOOP
        parts := string_to_array(item, '/');
        step := coalesce(parts[2]::integer, 1);
        IF parts[1] IN ('*', '?') THEN
            lo := low;
            hi := high;
        ELSE
            bounds := string_to_array(parts[1], '-');
            lo := coalesce(array_position(names, bounds[1]) - 1 + low, bounds[1]::integer);
            hi := CASE WHEN cardinality(bounds) > 1
                       THEN coalesce(array_position(names, bounds[2]) - 1 + low,
                                     bounds[2]::integer)
                       WHEN parts[2] IS NOT NULL THEN high
                       ELSE lo END;
        END IF;
        IF step > 0 AND value BETWEEN lo AND hi AND (value - lo) % step = 0 THEN
            RETURN true;
        END IF;
    END LOOP;
    RETURN false;
END;
$$;

-- Whether wall time `wall` matches the six fields (seconds first); any_minute: the
-- seconds and minutes fields are not checked (a wall time in a skipped hour).
CREATE FUNCTION @schema@.cron_wall_matches(fields text[], wall timestamp, any_minute boolean)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    months constant text[] := ARRAY['JAN', 'FEB', 'MAR', 'APR', 'MAY', 'JUN', 'JUL', 'AUG',
                                    'SEP', 'OCT', 'NOV', 'DEC'];
    days constant text[] := ARRAY['SUN', 'MON', 'TUE', 'WED', 'THU', 'FRI', 'SAT'];
    day_of_week integer := extract(dow FROM wall)::integer;
    dom_ok boolean;
    dow_ok boolean;
BEGIN
    dom_ok := @schema@.cron_field_matches(fields[4], extract(day FROM wall)::integer, 1, 31,
                                          NULL);
    dow_ok := @schema@.cron_field_matches(fields[6], day_of_week, 0, 7, days)
              OR (day_of_week = 0 AND @schema@.cron_field_matches(fields[6], 7, 0, 7, days));
    RETURN (any_minute OR (
                @schema@.cron_field_matches(fields[1], extract(second FROM wall)::integer,
                                            0, 59, NULL)
                AND @schema@.cron_field_matches(fields[2], extract(minute FROM wall)::integer,
                                                0, 59, NULL)))
       AND @schema@.cron_field_matches(fields[3], extract(hour FROM wall)::integer, 0, 23,
                                       NULL)
       AND @schema@.cron_field_matches(fields[5], extract(month FROM wall)::integer, 1, 12,
                                       months)
       AND CASE WHEN left(fields[4], 1) IN ('*', '?') OR left(fields[6], 1) IN ('*', '?')
                THEN dom_ok AND dow_ok
                ELSE dom_ok OR dow_ok END;
END;
$$;

CREATE FUNCTION @schema@.cron_matches(expression text, zone text, at timestamptz)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fields text[] := regexp_split_to_array(btrim(expression), '\s+');
    wall timestamp := at AT TIME ZONE zone;
BEGIN
    IF cardinality(fields) = 5 THEN
        fields := array_prepend('0', fields);
    ELSIF cardinality(fields) <> 6 THEN
        RETURN false;
    END IF;
    RETURN @schema@.cron_wall_matches(fields, wall, false)
        -- the clocks jumped forward at `at` (spring): the skipped wall times fire now
        OR ((at - interval '1 second') AT TIME ZONE zone + interval '1 second' < wall
            AND @schema@.cron_wall_matches(fields, date_trunc('hour', wall) - interval '1 hour',
                                           true));
END;
$$;

-- Schedules an operator declared, fired by name and tick, the job built from the stored
-- definition (0022: handler, payload, queue, priority, max_attempts; 0034:
-- concurrency_key, dedupe_key, dedupe_window; the overlap policy too; schedule_declare is
-- the operator's), only at a tick the
-- stored schedule produces: a whole second, on its `every` (multiples of it since the
-- epoch) or its cron expression; at most 60 s ahead of the server's clock (a host's clock
-- may run ahead); and not older than the schedule fires (within 120 s of now: a tick's
-- grace of at most 60 s, and 60 s of clock skew), except the catch-up of catch_up =
-- "last": the latest tick missed, when it is later than every tick handled of the
-- schedule. Each tick once (schedule_runs' key, 0010). The worker must be a live daemon of
-- the registry. A refused tick raises 22023 with the reason and creates nothing.
CREATE FUNCTION @schema@.schedule_fire_v2(
    name text, tick timestamptz, worker text, OUT outcome text, OUT job_id bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    stored @schema@.schedules;
    job jsonb;
    every float8;
    produced boolean;
    handled timestamptz;
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
    IF NOT EXISTS (SELECT 1 FROM @schema@.workers w
                    WHERE w.id = schedule_fire_v2.worker AND w.state <> 'gone'
                      AND w.heartbeat_at > now() - 2 * w.heartbeat_interval
                      AND w.heartbeat_at <= now() + interval '5 seconds') THEN
        RAISE EXCEPTION 'pgworkerd: schedule %: worker % is no live daemon of the registry',
            quote_literal(name), quote_literal(coalesce(worker, 'NULL'))
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A daemon fires schedules under the id it registered and heartbeats.';
    END IF;
    IF jsonb_typeof(stored.definition -> 'every') = 'number' THEN
        every := (stored.definition ->> 'every')::float8;
    END IF;
    produced := extract(microseconds FROM tick)::bigint % 1000000 = 0
        AND CASE WHEN every > 0
                 THEN extract(epoch FROM tick)::numeric % every::numeric = 0
                 WHEN coalesce(stored.definition ->> 'cron', '') <> ''
                 THEN @schema@.cron_matches(stored.definition ->> 'cron',
                                            coalesce(stored.definition ->> 'timezone', 'UTC'),
                                            tick)
                 ELSE false END;
    IF NOT produced THEN
        RAISE EXCEPTION 'pgworkerd: schedule %: % is no tick of it', quote_literal(name), tick
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF tick > now() + interval '60 seconds' THEN
        RAISE EXCEPTION 'pgworkerd: schedule %: tick % is in the future', quote_literal(name),
            tick
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A tick is fired when due; this host''s clock may run ahead.';
    END IF;
    IF tick < now() - interval '120 seconds' THEN
        SELECT max(r.tick) INTO handled
          FROM @schema@.schedule_runs r WHERE r.schedule = schedule_fire_v2.name;
        IF coalesce(stored.definition ->> 'catch_up', 'last') <> 'last'
           OR tick <= greatest(handled, stored.created_at) THEN
            RAISE EXCEPTION 'pgworkerd: schedule %: tick % is past (catch_up %, handled up '
                            'to %)', quote_literal(name), tick,
                coalesce(stored.definition ->> 'catch_up', 'last'),
                coalesce(greatest(handled, stored.created_at)::text, 'none')
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    SELECT jsonb_object_agg(e.key, e.value) INTO job
      FROM jsonb_each(jsonb_build_object(
               'handler', stored.definition -> 'handler',
               'payload', coalesce(stored.definition -> 'payload', '{}'::jsonb),
               'queue', stored.definition -> 'queue',
               'priority', stored.definition -> 'priority',
               'max_attempts', stored.definition -> 'max_attempts',
               -- the keys of the jobs it fires (0034)
               'concurrency_key', stored.definition -> 'concurrency_key',
               'dedupe_key', stored.definition -> 'dedupe_key',
               'dedupe_window', stored.definition -> 'dedupe_window')) e
     WHERE jsonb_typeof(e.value) <> 'null';
    SELECT f.outcome, f.job_id INTO outcome, job_id
      FROM @schema@.schedule_fire(name, tick, job,
                                  coalesce(stored.definition ->> 'overlap', 'skip'), worker) f;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.schedule_fire_v2(text, timestamptz, text) FROM PUBLIC;

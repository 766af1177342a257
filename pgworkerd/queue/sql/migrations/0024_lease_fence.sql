-- A daemon role that cannot touch other hosts' attempts, fire schedules at ticks of its choosing, or keep fake daemons alive (issue 22).
-- compatible-with-code-of-schema: 5
--
-- An expand migration (README "Upgrading"): a trigger, functions, two registry columns and
-- a one-row table are added; schedule_fire_v2 keeps its name and arguments and checks its
-- tick and worker. Code of every schema from 5 on runs unchanged: older daemons claim with
-- their own statements (the trigger gives their claims random tokens too, returned by
-- their RETURNING), and write the registry with the table rights an earlier roles.sql gave.
-- roles.sql of this release then takes from pgworkerd_daemon the SELECT of lease tokens
-- and INSERT/UPDATE on workers: re-apply it once every daemon runs this release (the
-- functions below are granted now, at the end, to the roles that hold a daemon's rights).

-- Lease tokens (the fence every renew and finish names) were a counter: who saw one
-- token knew the next. Every new token is drawn at random now, from the server's strong
-- random source (gen_random_uuid, pg_strong_random): 60 random bits, plus 2^60 so that
-- every new token is above every counter token of earlier releases. One trigger, whatever
-- statement claims (claim_jobs, the claims of older releases, a burial), so no claim text
-- changes. A token is never ordered: attempts and logs are ordered by time.
CREATE FUNCTION @schema@.lease_token_draw()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    LOOP
        -- the uuid's last 8 bytes: 62 random bits (the variant takes 2), 60 of them kept
        NEW.lease_token := (1::bigint << 60)
            | (('x' || encode(substr(uuid_send(gen_random_uuid()), 9, 8), 'hex'))::bit(64)::bigint
               & ((1::bigint << 60) - 1));
        EXIT WHEN NEW.lease_token <> OLD.lease_token;
    END LOOP;
    RETURN NEW;
END;
$$;

CREATE TRIGGER jobs_lease_token_drawn
    BEFORE UPDATE OF lease_token ON @schema@.jobs
    FOR EACH ROW
    WHEN (NEW.lease_token IS DISTINCT FROM OLD.lease_token)
    EXECUTE FUNCTION @schema@.lease_token_draw();

-- What a daemon whose outcome was refused checks (outcomes.py): the job's status and
-- holder, and whether its token is still the one the caller names, without the token
-- itself (roles.sql does not let the daemon role read tokens: it could end or renew
-- another host's attempt with one). No row: no such job.
CREATE FUNCTION @schema@.job_lease_state_v1(id bigint, token bigint)
RETURNS TABLE (status text, token_holds boolean, locked_by text)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT j.status::text, j.lease_token = job_lease_state_v1.token, j.locked_by
      FROM @schema@.jobs j
     WHERE j.id = job_lease_state_v1.id;
$$;
REVOKE EXECUTE ON FUNCTION @schema@.job_lease_state_v1(bigint, bigint) FROM PUBLIC;

-- job_get_v1 (0018) gives a job to its enqueuer and to roles that may read jobs: since
-- roles.sql of schema 24 the daemon role reads every column of jobs but lease_token (a
-- column grant), so "may read jobs" is any column's SELECT now. It returns no token.
CREATE OR REPLACE FUNCTION @schema@.job_get_v1(job_id bigint)
RETURNS TABLE (id bigint, queue text, handler text, status text, priority integer,
               attempts integer, max_attempts integer, snoozes integer, result jsonb,
               progress jsonb, last_error text, cancel_requested boolean,
               run_at timestamptz, created_at timestamptz, started_at timestamptz,
               finished_at timestamptz)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT j.id, j.queue, j.handler, j.status::text, j.priority, j.attempts,
           j.max_attempts, j.snoozes, j.result, j.progress, j.last_error,
           j.cancel_requested, j.run_at, j.created_at, j.started_at, j.finished_at
      FROM @schema@.jobs j
     WHERE j.id = job_get_v1.job_id
       AND (j.enqueued_by = session_user
            OR has_any_column_privilege(session_user, '@schema@.jobs', 'SELECT'));
END;
$$;

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

-- Schedules an operator declared, fired by name and tick (0022), now only at a tick the
-- stored schedule produces: a whole second, on its `every` (multiples of it since the
-- epoch) or its cron expression; at most 60 s ahead of the server's clock (a host's clock
-- may run ahead); and not older than the schedule fires (within 120 s of now: a tick's
-- grace of at most 60 s, and 60 s of clock skew), except the catch-up of catch_up =
-- "last": the latest tick missed, when it is later than every tick handled of the
-- schedule. Each tick once (schedule_runs' key, 0010). The worker must be a live daemon of
-- the registry. A refused tick raises 22023 with the reason and creates nothing.
CREATE OR REPLACE FUNCTION @schema@.schedule_fire_v2(
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
               'max_attempts', stored.definition -> 'max_attempts')) e
     WHERE jsonb_typeof(e.value) <> 'null';
    SELECT f.outcome, f.job_id INTO outcome, job_id
      FROM @schema@.schedule_fire(name, tick, job,
                                  coalesce(stored.definition ->> 'overlap', 'skip'), worker) f;
END;
$$;

-- The registry: each daemon writes its own row only. A daemon draws a secret when it
-- starts (at least 32 characters, never stored: its SHA-256 is) and names it in every
-- write of its row; an id registered with another secret is refused. The row records the
-- login that registered it (registered_by), and a login may keep at most
-- registry_cap.max_live_per_login rows not gone (100 until an operator changes it;
-- a login that may INSERT into workers itself is not held to it, as for the retention
-- floor): a
-- compromised host can still register that many daemons and keep them fresh, as any
-- daemon of its login, but no more (README "Who can do what").
ALTER TABLE @schema@.workers
    ADD COLUMN secret_sha256 bytea,
    ADD COLUMN registered_by text;

CREATE TABLE @schema@.registry_cap (
    single boolean PRIMARY KEY DEFAULT true CHECK (single),
    max_live_per_login integer NOT NULL CHECK (max_live_per_login BETWEEN 1 AND 100000),
    set_by text NOT NULL DEFAULT session_user,
    set_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO @schema@.registry_cap (max_live_per_login, set_by) VALUES (100, 'pgworkerd migrate');

-- The row of `id` if `secret` is its secret; raises 42501 (22023 for a malformed secret).
CREATE FUNCTION @schema@.worker_secret_digest(secret text)
RETURNS bytea
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF secret IS NULL OR length(secret) NOT BETWEEN 32 AND 256 THEN
        RAISE EXCEPTION 'pgworkerd: a daemon''s registry secret must be 32 to 256 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN sha256(convert_to(secret, 'UTF8'));
END;
$$;

-- What a daemon may write into its row, bounded (a compromised host writes its own row
-- only, but every peer and `status` reads it): names of 1 to 255 characters, at most
-- 10,000 queues, handlers and in-flight jobs, settings of at most 1 MB. Raises 22023.
CREATE FUNCTION @schema@.worker_row_check(host text, version text, queues text[],
                                          handlers text[], handler_settings jsonb,
                                          in_flight bigint[])
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF host IS NULL OR length(host) NOT BETWEEN 1 AND 255
       OR version IS NULL OR length(version) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'pgworkerd: a daemon''s host and version must be 1 to 255 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF coalesce(cardinality(queues), 0) > 10000 OR coalesce(cardinality(handlers), 0) > 10000
       OR coalesce(cardinality(in_flight), 0) > 10000
       OR EXISTS (SELECT 1 FROM unnest(queues || handlers) n
                   WHERE n IS NULL OR length(n) NOT BETWEEN 1 AND 255) THEN
        RAISE EXCEPTION 'pgworkerd: a daemon names at most 10,000 queues, handlers and '
                        'in-flight jobs, each name 1 to 255 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_column_size(handler_settings) > 1048576 THEN
        RAISE EXCEPTION 'pgworkerd: a daemon''s handler settings must be at most 1 MB'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;

-- Record a daemon (worker_register of queries.sql before schema 24), or record it again
-- after it was marked gone, under the secret it registered with. Returns the id.
CREATE FUNCTION @schema@.worker_register_v2(
    id text, secret text, host text, pid integer, version text, queues text[],
    handlers text[], slots integer, state text, handler_settings jsonb,
    heartbeat_interval float8)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    digest bytea := @schema@.worker_secret_digest(secret);
    existing @schema@.workers;
    cap integer;
    live integer;
BEGIN
    IF id IS NULL OR id = '' OR length(id) > 255 THEN
        RAISE EXCEPTION 'pgworkerd: a daemon id must be 1 to 255 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @schema@.worker_row_check(host, version, queues, handlers, handler_settings,
                                      NULL);
    SELECT * INTO existing FROM @schema@.workers w WHERE w.id = worker_register_v2.id
       FOR UPDATE;
    IF FOUND AND existing.secret_sha256 IS DISTINCT FROM digest THEN
        RAISE EXCEPTION 'pgworkerd: daemon id % is registered already, with another secret',
            quote_literal(id)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Each daemon registers an id of its own (host:pid:random).';
    END IF;
    -- (a caller that may INSERT rows itself, the owner, is not held to the cap)
    IF (NOT FOUND OR existing.state = 'gone')
       AND NOT has_table_privilege(session_user, '@schema@.workers', 'INSERT') THEN
        -- one registration of a login at a time, so that the count holds
        PERFORM pg_advisory_xact_lock(
            hashtextextended('pgworkerd.registry.cap:' || @schema_literal@ || ':'
                             || session_user, 0));
        SELECT c.max_live_per_login INTO cap FROM @schema@.registry_cap c;
        SELECT count(*) INTO live FROM @schema@.workers w
         WHERE w.registered_by = session_user AND w.state <> 'gone';
        IF live >= cap THEN
            RAISE EXCEPTION 'pgworkerd: login % has % daemons registered and not gone, the '
                            'most the registry allows one login', quote_ident(session_user),
                            live
                USING ERRCODE = 'configuration_limit_exceeded',
                      HINT = 'An operator raises the cap: UPDATE ' || @schema_literal@
                             || '.registry_cap SET max_live_per_login = N.';
        END IF;
    END IF;
    INSERT INTO @schema@.workers AS w (id, host, pid, version, queues, handlers, slots, state,
                                       handler_settings, heartbeat_interval, secret_sha256,
                                       registered_by)
    VALUES (id, host, pid, version, queues, handlers, slots, state, handler_settings,
            make_interval(secs => heartbeat_interval), digest, session_user)
    ON CONFLICT ON CONSTRAINT workers_pkey DO UPDATE
       SET state = excluded.state, queues = excluded.queues, handlers = excluded.handlers,
           slots = excluded.slots, handler_settings = excluded.handler_settings,
           heartbeat_interval = excluded.heartbeat_interval,
           heartbeat_at = now(), stopped_at = NULL;
    PERFORM pg_notify(@schema_literal@ || '.wake', CASE
        WHEN octet_length(array_to_string(queues, ',') || array_to_string(handlers, ','))
             < 6000
        THEN json_build_object('peer', 'up', 'id', id, 'queues', queues,
                               'handlers', handlers, 'slots', slots)
        ELSE json_build_object('peer', 'up', 'id', id) END::text);
    RETURN id;
END;
$$;

-- A heartbeat (worker_heartbeat before schema 24) of the caller's own row: its state,
-- in-flight jobs and settings, heartbeat_at set to the server's now(). No row: the row is
-- gone (or the secret is not its own): register again.
CREATE FUNCTION @schema@.worker_heartbeat_v2(
    id text, secret text, state text, in_flight bigint[], queues text[], handlers text[],
    slots integer, handler_settings jsonb, heartbeat_interval float8)
RETURNS TABLE (drain_requested boolean, hand_back_requested_at timestamptz,
               hand_back_grace float8, hand_back_queues text[], hand_back_handlers text[])
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF worker_heartbeat_v2.state = 'gone' THEN
        RAISE EXCEPTION 'pgworkerd: a heartbeat cannot mark a daemon gone (deregister does)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @schema@.worker_row_check(
        'h', 'v', worker_heartbeat_v2.queues, worker_heartbeat_v2.handlers,
        worker_heartbeat_v2.handler_settings, worker_heartbeat_v2.in_flight);
    RETURN QUERY
    UPDATE @schema@.workers w
       SET state = worker_heartbeat_v2.state, in_flight = worker_heartbeat_v2.in_flight,
           queues = worker_heartbeat_v2.queues, handlers = worker_heartbeat_v2.handlers,
           slots = worker_heartbeat_v2.slots,
           handler_settings = worker_heartbeat_v2.handler_settings,
           heartbeat_interval = make_interval(secs => worker_heartbeat_v2.heartbeat_interval),
           heartbeat_at = now(), hand_back_seen_at = w.hand_back_requested_at
     WHERE w.id = worker_heartbeat_v2.id AND w.state <> 'gone'
       AND w.secret_sha256 = @schema@.worker_secret_digest(worker_heartbeat_v2.secret)
    RETURNING w.drain_requested, w.hand_back_requested_at,
              extract(epoch FROM w.hand_back_grace)::float8, w.hand_back_queues,
              w.hand_back_handlers;
END;
$$;

-- A daemon that exits cleanly marks its own row gone; its peers hear so.
CREATE FUNCTION @schema@.worker_deregister_v2(id text, secret text)
RETURNS SETOF text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH gone AS (
        UPDATE @schema@.workers w
           SET state = 'gone', in_flight = '{}', stopped_at = now(), heartbeat_at = now()
         WHERE w.id = worker_deregister_v2.id
           AND w.secret_sha256 = @schema@.worker_secret_digest(worker_deregister_v2.secret)
        RETURNING w.id
    )
    SELECT g.id FROM gone g, LATERAL (
        SELECT pg_notify(@schema_literal@ || '.wake',
                         json_build_object('peer', 'down', 'id', g.id)::text)) AS sent;
END;
$$;

-- Which schedules the caller's own row declares (worker_schedules_set before schema 24).
CREATE FUNCTION @schema@.worker_schedules_set_v2(id text, secret text, schedules text[])
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    UPDATE @schema@.workers w SET schedules = coalesce(worker_schedules_set_v2.schedules, '{}')
     WHERE w.id = worker_schedules_set_v2.id
       AND w.secret_sha256 = @schema@.worker_secret_digest(worker_schedules_set_v2.secret);
    RETURN FOUND;
END;
$$;

-- Daemons silent for longer than `stale_after` seconds (60 at least: no caller marks a
-- live daemon gone) are marked gone, by one caller at a time (worker_mark_stale before
-- schema 24); returns them.
CREATE FUNCTION @schema@.worker_mark_stale_v2(stale_after float8)
RETURNS TABLE (id text, host text, pid integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF stale_after IS NULL OR NOT (stale_after BETWEEN 60 AND 86400) THEN
        RAISE EXCEPTION 'pgworkerd: stale_after must be from 60 to 86400 seconds, not %',
            coalesce(stale_after::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH gone AS (
        UPDATE @schema@.workers w
           SET state = 'gone', stopped_at = now()
         WHERE (SELECT pg_try_advisory_xact_lock(
                    hashtextextended('pgworkerd.registry.mark_stale:' || @schema_literal@, 0)))
           AND w.state <> 'gone'
           AND w.heartbeat_at < now() - make_interval(secs => worker_mark_stale_v2.stale_after)
        RETURNING w.id, w.host, w.pid
    )
    SELECT g.id, g.host, g.pid FROM gone g, LATERAL (
        SELECT pg_notify(@schema_literal@ || '.wake',
                         json_build_object('peer', 'down', 'id', g.id)::text)) AS sent;
END;
$$;

REVOKE EXECUTE ON FUNCTION
    @schema@.worker_register_v2(text, text, text, integer, text, text[], text[], integer, text,
                                jsonb, float8),
    @schema@.worker_heartbeat_v2(text, text, text, bigint[], text[], text[], integer, jsonb,
                                 float8),
    @schema@.worker_deregister_v2(text, text),
    @schema@.worker_schedules_set_v2(text, text, text[]),
    @schema@.worker_mark_stale_v2(float8)
    FROM PUBLIC;

-- A rolling upgrade without a window, as in 0022: the roles that may claim today (EXECUTE
-- on claim_jobs: pgworkerd_daemon of roles.sql, whatever it is named) get EXECUTE on what
-- the daemon of this release calls, now; roles.sql of this release then takes away the
-- table rights that daemons of earlier releases wrote the registry with. The schema owner
-- needs no grant.
DO $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT r.rolname
          FROM pg_catalog.pg_proc p, LATERAL pg_catalog.aclexplode(p.proacl) a
          JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
         WHERE p.oid = '@schema@.claim_jobs(text, text[], text[], float8[], integer[], integer, '
                       'integer[], jsonb, integer[], integer[])'::regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
    LOOP
        EXECUTE pg_catalog.format(
            'GRANT EXECUTE ON FUNCTION '
            '@schema@.job_lease_state_v1(bigint, bigint), '
            '@schema@.worker_register_v2(text, text, text, integer, text, text[], text[], '
            'integer, text, jsonb, float8), '
            '@schema@.worker_heartbeat_v2(text, text, text, bigint[], text[], text[], integer, '
            'jsonb, float8), '
            '@schema@.worker_deregister_v2(text, text), '
            '@schema@.worker_schedules_set_v2(text, text, text[]), '
            '@schema@.worker_mark_stale_v2(float8) TO %I', grantee);
    END LOOP;
END
$$;

-- The registry of daemons, for status, drain and stale-daemon detection: the table, the
-- drain and hand-back functions an operator calls, and the one definition of a silent
-- daemon.

CREATE TABLE @schema@.workers (
    id              text PRIMARY KEY,
    host            text NOT NULL,
    pid             integer NOT NULL,
    version         text NOT NULL,
    queues          text[] NOT NULL DEFAULT '{}',
    handlers        text[] NOT NULL DEFAULT '{}',
    slots           integer NOT NULL CHECK (slots >= 0),
    in_flight       bigint[] NOT NULL DEFAULT '{}',
    state           text NOT NULL DEFAULT 'starting'
                    CHECK (state IN ('starting', 'running', 'draining', 'drained', 'stopping',
                                     'gone')),
    -- Set by `pgworkerd drain`, cleared by `pgworkerd resume`; the daemon reads it.
    drain_requested boolean NOT NULL DEFAULT false,
    started_at      timestamptz NOT NULL DEFAULT now(),
    heartbeat_at    timestamptz NOT NULL DEFAULT now(),
    stopped_at      timestamptz,
    -- Which schedules each daemon declares: `pgworkerd schedules` shows whether a live
    -- daemon declares a schedule now (a schedule removed from every config stops firing).
    schedules       text[] NOT NULL DEFAULT '{}',
    -- The handler settings a daemon claims with (handler name -> {"queues", "slots",
    -- "max_running", "max_running_per_key"}): written at register and heartbeat, read by
    -- `explain` to tell whether a fleet-wide or per-key limit holds a job back.
    handler_settings jsonb NOT NULL DEFAULT '{}',
    -- The hand-back drain (pgworkerd drain --hand-back): on top of drain_requested (stop
    -- claiming), a request to hand running jobs back. NULL hand_back_requested_at: none.
    -- hand_back_grace NULL: each handler's stop_grace (the daemon's config); the filters
    -- NULL: every queue / every handler (both given: jobs of those handlers on those
    -- queues). hand_back_seen_at: the request the daemon last read (its heartbeat copies
    -- hand_back_requested_at), so that `drain --wait` knows the daemon has acted on it.
    hand_back_requested_at timestamptz,
    hand_back_grace interval,
    hand_back_queues text[],
    hand_back_handlers text[],
    hand_back_seen_at timestamptz,
    -- The longest a daemon lets pass between two registry heartbeats, as it promised at
    -- its latest one: 5 s while it holds running jobs, 10 s while idle
    -- (daemon/presence.py). Bounded: an interval of a day would hide a dead daemon for
    -- two, one of 0 flag a live one.
    heartbeat_interval interval NOT NULL DEFAULT '10 seconds'
        CONSTRAINT workers_heartbeat_interval_check
        CHECK (heartbeat_interval >= interval '1 second'
               AND heartbeat_interval <= interval '1 hour'),
    -- The SHA-256 of the secret the daemon drew when it started (never the secret): every
    -- write of the row names the secret (worker_register_v2 and the functions after it).
    -- And the login that registered the row, which registry_cap bounds.
    secret_sha256   bytea,
    registered_by   text,
    -- The channel the daemon listens on for the wake-ups chosen for it (0040: workers_wake),
    -- set through worker_wake_channel_set while it listens there; NULL: it hears only the
    -- fleet's channel (a daemon before 0040, or one whose LISTEN connection is down).
    wake_channel    text
        CONSTRAINT workers_wake_channel_check CHECK (octet_length(wake_channel) <= 63)
);

CREATE INDEX workers_host_idx ON @schema@.workers (host);

-- Live daemons (0007): stale marking, drain, resume and status ask for state <> 'gone'.
CREATE INDEX workers_live_idx ON @schema@.workers (heartbeat_at) WHERE state <> 'gone';

-- Drains and hand-back drains (0017).

-- A queue or handler filter of a hand-back: NULL (all), or 1 to 100 valid names.
CREATE FUNCTION @schema@.drain_names_ok(names text[])
RETURNS boolean
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
RETURN names IS NULL
    OR (cardinality(names) BETWEEN 1 AND 100
        AND array_ndims(names) = 1
        AND NOT EXISTS (SELECT 1 FROM unnest(names) AS n
                         WHERE n IS NULL OR NOT @schema@.enqueue_name_ok(n)));

-- Ask live daemons to drain: one id (target_worker), one host (target_host), or all (both
-- NULL). hand_back false: a plain drain (stop claiming, let jobs finish). hand_back true:
-- stop claiming what is targeted (only_queues / only_handlers; NULL: all) and hand back
-- the targeted running jobs after the grace (NULL: each handler's stop_grace; 0 to 1 day).
-- On a daemon with a hand-back in place: the filters widen to the union (NULL wins), the
-- shorter of two given graces is kept, and a daemon keeps each job's earliest hand-back
-- time of the requests it read (a second request never gives a job more time). A plain
-- drain never takes a hand-back back; drain_lift does. An unfiltered hand-back also sets
-- drain_requested, so daemons of older code at least stop claiming.
-- Returns the daemons asked (none: no live daemon matched). Definer's rights: callers
-- need EXECUTE only (deploy/roles.sql). The daemons hear of it at once ({"registry":
-- "drain"} on the wake channel: a hint; the row is the authority).
CREATE FUNCTION @schema@.drain_request(target_worker text, target_host text,
                                       hand_back boolean DEFAULT false,
                                       grace interval DEFAULT NULL,
                                       only_queues text[] DEFAULT NULL,
                                       only_handlers text[] DEFAULT NULL)
RETURNS TABLE (id text, host text, pid integer, state text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF target_worker IS NOT NULL AND target_host IS NOT NULL THEN
        RAISE EXCEPTION 'pgworkerd: give a daemon id or a host, not both'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF hand_back IS NULL THEN
        RAISE EXCEPTION 'pgworkerd: hand_back must be true or false, not NULL'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT hand_back AND (grace IS NOT NULL OR only_queues IS NOT NULL
                          OR only_handlers IS NOT NULL) THEN
        RAISE EXCEPTION 'pgworkerd: a grace and queue or handler filters apply to a hand-back '
            'only (a plain drain lets every job finish)' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF grace < interval '0' OR grace > interval '1 day' THEN
        RAISE EXCEPTION 'pgworkerd: the grace must be from 0 to 1 day, not %', grace
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT @schema@.drain_names_ok(only_queues) THEN
        RAISE EXCEPTION 'pgworkerd: queues must be 1 to 100 non-empty printable names of at '
            'most 128 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT @schema@.drain_names_ok(only_handlers) THEN
        RAISE EXCEPTION 'pgworkerd: handlers must be 1 to 100 non-empty printable names of at '
            'most 128 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH changed AS (
        UPDATE @schema@.workers w
           SET drain_requested = w.drain_requested
                   OR NOT hand_back
                   OR (w.hand_back_requested_at IS NULL
                       AND only_queues IS NULL AND only_handlers IS NULL)
                   OR (w.hand_back_requested_at IS NOT NULL
                       AND (only_queues IS NULL OR w.hand_back_queues IS NULL)
                       AND (only_handlers IS NULL OR w.hand_back_handlers IS NULL)),
               hand_back_requested_at = CASE WHEN hand_back THEN clock_timestamp()
                                             ELSE w.hand_back_requested_at END,
               hand_back_grace = CASE
                   WHEN NOT hand_back THEN w.hand_back_grace
                   WHEN w.hand_back_requested_at IS NULL THEN grace
                   WHEN grace IS NULL OR w.hand_back_grace IS NULL THEN grace
                   ELSE least(grace, w.hand_back_grace) END,
               hand_back_queues = CASE
                   WHEN NOT hand_back THEN w.hand_back_queues
                   WHEN only_queues IS NULL THEN NULL
                   WHEN w.hand_back_requested_at IS NOT NULL AND w.hand_back_queues IS NULL
                       THEN NULL
                   ELSE ARRAY(SELECT DISTINCT unnest(coalesce(w.hand_back_queues, '{}')
                                                     || only_queues)
                               ORDER BY 1) END,
               hand_back_handlers = CASE
                   WHEN NOT hand_back THEN w.hand_back_handlers
                   WHEN only_handlers IS NULL THEN NULL
                   WHEN w.hand_back_requested_at IS NOT NULL AND w.hand_back_handlers IS NULL
                       THEN NULL
                   ELSE ARRAY(SELECT DISTINCT unnest(coalesce(w.hand_back_handlers, '{}')
                                                     || only_handlers)
                               ORDER BY 1) END
         WHERE w.state <> 'gone'
           AND (target_worker IS NULL OR w.id = target_worker)
           AND (target_host IS NULL OR w.host = target_host)
        RETURNING w.id, w.host, w.pid, w.state
    )
    SELECT c.id, c.host, c.pid, c.state FROM changed c;
    IF FOUND THEN
        PERFORM pg_notify(@schema_literal@ || '.wake', '{"registry": "drain"}');
    END IF;
END;
$$;

-- Undo drains (plain and hand-back) on live daemons: one id, one host, or all. Returns the
-- daemons changed. Jobs whose grace is still running stay where they are.
CREATE FUNCTION @schema@.drain_lift(target_worker text, target_host text)
RETURNS TABLE (id text, host text, pid integer, state text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF target_worker IS NOT NULL AND target_host IS NOT NULL THEN
        RAISE EXCEPTION 'pgworkerd: give a daemon id or a host, not both'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH changed AS (
        UPDATE @schema@.workers w
           SET drain_requested = false, hand_back_requested_at = NULL, hand_back_grace = NULL,
               hand_back_queues = NULL, hand_back_handlers = NULL
         WHERE w.state <> 'gone'
           AND (target_worker IS NULL OR w.id = target_worker)
           AND (target_host IS NULL OR w.host = target_host)
        RETURNING w.id, w.host, w.pid, w.state
    )
    SELECT c.id, c.host, c.pid, c.state FROM changed c;
    IF FOUND THEN
        PERFORM pg_notify(@schema_literal@ || '.wake', '{"registry": "drain"}');
    END IF;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.drain_request(text, text, boolean, interval, text[], text[]),
                           @schema@.drain_lift(text, text)
    FROM PUBLIC;

-- The daemon's own row (0024).

-- The registry: each daemon writes its own row only. A daemon draws a secret when it
-- starts (at least 32 characters, never stored: its SHA-256 is) and names it in every
-- write of its row; an id registered with another secret is refused. The row records the
-- login that registered it (registered_by), and a login may keep at most
-- registry_cap.max_live_per_login rows not gone (100 until an operator changes it;
-- a login that may INSERT into workers itself is not held to it, as for the retention
-- floor): a
-- compromised host can still register that many daemons and keep them fresh, as any
-- daemon of its login, but no more (README "Who can do what").
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

-- Record a daemon (the statement worker_register before schema 24), or record it again
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

-- Silent daemons (0021).

-- The one definition of a silent daemon, used by `explain`, `status`, `show`, the
-- dashboard and the metric: its registry heartbeat is older than twice the interval it
-- promised (one heartbeat missed, and as long again for a loaded host or database).
-- Killed, frozen, or cut off from the database: nobody can tell which from here, so
-- nothing acts on it (a cut-off host's child runs on until its lease ends).
-- A SQL-standard body that PostgreSQL inlines into the calling statement (a function
-- with SET search_path is called row by row: 19 ms for 1,000 registry rows), its names
-- bound now, as the pinned search_path of the other functions would bind them.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

CREATE FUNCTION @schema@.daemon_silent(w @schema@.workers)
RETURNS boolean
LANGUAGE sql
STABLE
PARALLEL SAFE
RETURN w.heartbeat_at < now() - 2 * w.heartbeat_interval;

-- Wake-ups aimed at daemons (0040).

-- The channel of a daemon's own wake-ups: short whatever the schema's name (a channel name
-- is at most 63 bytes) and distinct per schema and daemon. Channels are per database.
CREATE FUNCTION @schema@.worker_wake_channel_name(worker text)
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
RETURN 'pgworkerd.w.' || left(md5(@schema_literal@ || ':' || worker), 24);

-- LISTEN on the caller's own channel (a daemon's LISTEN connection, before it says so in
-- its row with worker_wake_channel_set); returns the channel. LISTEN needs no right: any
-- role may listen anywhere, as any may NOTIFY.
CREATE FUNCTION @schema@.worker_wake_listen(worker text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    channel text := @schema@.worker_wake_channel_name(worker);
BEGIN
    EXECUTE format('LISTEN %I', channel);
    RETURN channel;
END;
$$;

-- Whether the caller's own row says it listens on its channel (the secret names the row,
-- as every write of it); false when there is no such row (register first).
CREATE FUNCTION @schema@.worker_wake_channel_set(id text, secret text, listening boolean)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    UPDATE @schema@.workers w
       SET wake_channel = CASE WHEN worker_wake_channel_set.listening
                               THEN @schema@.worker_wake_channel_name(w.id) END
     WHERE w.id = worker_wake_channel_set.id AND w.state <> 'gone'
       AND w.secret_sha256 = @schema@.worker_secret_digest(worker_wake_channel_set.secret);
    RETURN FOUND;
END;
$$;

-- Whose wake-up `n` new jobs of (queue, handler) are, the lowest of them `job_id`: a group
-- of the running daemons that serve both, are not draining and keep to their heartbeat
-- (not daemon_silent), ranked by the highest hash of each daemon's id seeded with the job
-- id (rendezvous hashing: an even share each; a daemon coming or going moves only its own
-- share), from the `skip`-th on, as many as hold the n jobs by their slots. Each is
-- notified on its own channel, so that one enqueue wakes one daemon process, not the
-- fleet (PostgreSQL 15 still signals every listening backend of the database, which reads
-- the notification and passes it over: see docs/design/daemon.md, "Wake-ups"). A group with a
-- daemon that has no channel (older, or not listening now), or no daemon at all for the
-- first group, and the notification also goes to the fleet's channel as before: every
-- daemon ranks it on its own ring (daemon/peers.py); a wake-up may be taken twice, never
-- dropped. A wake-up handed on past the last daemon goes nowhere: the last ones keep it.
-- The payload on a daemon's channel: {"q", "h", "id", "n", "skip", "next": where the next
-- group starts, "hops"}; on the fleet's: {"q", "h", "id", "n"} (with "skip" and "hops"
-- when handed on), as before 0040.
-- Called wherever jobs become due: the trigger of new jobs (notify_wake), a release
-- (release_job), a wait that ends (job_suspend, signal_send, job_waits_expire), parents
-- that finished (job_children_resolve, job_held_release), a batch's callback
-- (batch_member_count); and by daemons handing on a wake-up they cannot take (skip = next,
-- hops + 1). Names longer than enqueue allows (a direct INSERT) are left out of the
-- payload, which goes to the fleet's channel. Returns the daemons notified on their own
-- channel.
CREATE FUNCTION @schema@.workers_wake(queue text, handler text, job_id bigint, n bigint,
                                     skip integer, hops integer)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    daemon record;
    held bigint := 0;
    size integer := 0;
    channels text[] := '{}';
    fleet boolean := false;
    body text;
BEGIN
    IF queue IS NULL OR handler IS NULL OR job_id IS NULL OR n IS NULL OR n < 1
       OR skip IS NULL OR skip < 0 OR hops IS NULL OR hops < 0 THEN
        RAISE EXCEPTION 'pgworkerd: workers_wake needs a queue, a handler, a job id, n >= 1, '
                        'skip >= 0 and hops >= 0'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(queue) + octet_length(handler) > 2048 THEN
        -- names longer than enqueue allows (a direct INSERT): left out of the payload
        -- rather than failing on NOTIFY's 8,000-byte limit; a wake-up for every handler
        PERFORM pg_notify(@schema_literal@ || '.wake',
                          json_build_object('id', job_id, 'n', n)::text);
        RETURN 0;
    END IF;
    FOR daemon IN
        SELECT w.wake_channel, greatest(w.slots, 1) AS slots
          FROM @schema@.workers w
         WHERE w.state = 'running' AND NOT w.drain_requested
           AND NOT @schema@.daemon_silent(w)
           AND w.heartbeat_at <= now() + interval '5 seconds'
           AND workers_wake.queue = ANY (w.queues) AND workers_wake.handler = ANY (w.handlers)
         ORDER BY hashtextextended(w.id, workers_wake.job_id) DESC, w.id
         -- (a daemon holds one job at least: n daemons at most, a top-n sort)
         LIMIT least(n, 5000) OFFSET skip
    LOOP
        EXIT WHEN held >= n;
        held := held + daemon.slots;
        size := size + 1;
        IF daemon.wake_channel IS NULL THEN
            fleet := true;
        ELSE
            channels := channels || daemon.wake_channel;
        END IF;
    END LOOP;
    body := json_build_object('q', queue, 'h', handler, 'id', job_id, 'n', n)::text;
    IF fleet OR (size = 0 AND skip = 0) THEN
        -- as the trigger sent it before 0040 (and a daemon's forward: with skip and hops)
        PERFORM pg_notify(@schema_literal@ || '.wake',
                          CASE WHEN skip = 0 AND hops = 0 THEN body
                          ELSE left(body, -1) || format(', "skip" : %s, "hops" : %s}', skip, hops)
                          END);
    END IF;
    body := left(body, -1) || format(', "skip" : %s, "next" : %s, "hops" : %s}',
                                     skip, skip + size, hops);
    PERFORM pg_notify(c, body) FROM unnest(channels) AS c;
    RETURN cardinality(channels);
END;
$$;

REVOKE EXECUTE ON FUNCTION
    @schema@.worker_wake_channel_set(text, text, boolean),
    @schema@.workers_wake(text, text, bigint, bigint, integer, integer)
    FROM PUBLIC;

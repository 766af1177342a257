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
               AND heartbeat_interval <= interval '1 hour')
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

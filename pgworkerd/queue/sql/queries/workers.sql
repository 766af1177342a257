-- Statements on the registry of daemons (sql/objects/workers.sql).
--
-- Each statement under a "-- name:" header with a one-line description; queue/queries.py
-- loads every file of this folder into one registry (a name is defined once, in the file
-- of its entity: docs/development/sql.md). @schema@ is replaced by the quoted schema
-- name, @schema_literal@ by it as a string literal and @notify_channel@ (and the other
-- @..._channel@) by the quoted name of a channel; parameters are psycopg's %(name)s
-- placeholders (so a literal percent sign is written %%).

-- name: worker_register
-- Record a daemon in the registry, or record it again after it was marked gone, under the
-- secret it drew at start (%(secret)s; schema 24: only the row's own daemon writes it).
-- drain_requested is kept then: a drained daemon marked gone during an outage comes back
-- drained. A restarted daemon has a new id, so it starts undrained. Its peers hear of it
-- on the wake channel ({"peer": "up", ...}; just the id when its lists are too long for
-- a payload, and they read the registry then).
SELECT @schema@.worker_register_v2(
    %(id)s::text, %(secret)s::text, %(host)s::text, %(pid)s::integer, %(version)s::text,
    %(queues)s::text[], %(handlers)s::text[], %(slots)s::integer, %(state)s::text,
    %(settings)s::jsonb, %(heartbeat_interval)s::float8);

-- name: worker_heartbeat
-- Record this daemon's state and in-flight jobs, and the most it lets pass before its
-- next heartbeat (%(heartbeat_interval)s seconds; migration 0021); returns the drain
-- requested of it: the plain drain flag and the hand-back request (0017; grace in
-- seconds, NULL: each handler's stop_grace). The hand-back request is marked seen:
-- `drain --wait` waits for it. heartbeat_at is the server's now() (schema 24).
SELECT drain_requested, hand_back_requested_at, hand_back_grace, hand_back_queues,
       hand_back_handlers
  FROM @schema@.worker_heartbeat_v2(
           %(id)s::text, %(secret)s::text, %(state)s::text, %(in_flight)s::bigint[],
           %(queues)s::text[], %(handlers)s::text[], %(slots)s::integer,
           %(settings)s::jsonb, %(heartbeat_interval)s::float8);

-- name: worker_deregister
-- A daemon that exits cleanly marks itself gone (and its peers hear so: {"peer": "down"}).
SELECT g FROM @schema@.worker_deregister_v2(%(id)s::text, %(secret)s::text) g;

-- name: worker_mark_stale
-- Daemons silent for longer than %(stale_after)s seconds (60 at least) are marked gone, by
-- one caller at a time: under a transaction-level advisory lock keyed by the schema, so
-- that a caller that finds it taken marks nothing (no row) instead of waiting. Served by
-- workers_live_idx (0007). Peers hear of each on the wake channel ({"peer": "down"}).
SELECT id, host, pid FROM @schema@.worker_mark_stale_v2(%(stale_after)s::float8);

-- name: worker_request_drain
-- A drain (plain, or with hand_back a hand-back) of live daemons: one id, one host, or all
-- (NULL filters); checked and applied by drain_request (0017), which notifies them.
SELECT id, host, pid, state
  FROM @schema@.drain_request(%(id)s::text, %(host)s::text, %(hand_back)s::boolean,
                              make_interval(secs => %(grace)s::float8),
                              %(queues)s::text[], %(handlers)s::text[]);

-- name: worker_lift_drain
-- `pgworkerd resume`: undo plain and hand-back drains of live daemons (drain_lift, 0017).
SELECT id, host, pid, state FROM @schema@.drain_lift(%(id)s::text, %(host)s::text);

-- name: worker_hand_back_progress
-- What `drain --hand-back --wait` waits for, per daemon asked (live ones; gone ones hold
-- nothing): whether it has read the request (or, code of an older schema, drained), and
-- its running jobs that the request targets, from the jobs table (the authority).
SELECT w.id, w.host, w.pid, w.state,
       (w.hand_back_requested_at IS NOT NULL
        AND w.hand_back_seen_at = w.hand_back_requested_at) OR w.state = 'drained' AS seen,
       ARRAY(SELECT j.id FROM @schema@.jobs j
              WHERE j.status = 'running' AND j.locked_by = w.id
                AND (w.hand_back_queues IS NULL OR j.queue = ANY(w.hand_back_queues))
                AND (w.hand_back_handlers IS NULL OR j.handler = ANY(w.hand_back_handlers))
              ORDER BY j.id) AS running_jobs
  FROM @schema@.workers w
 WHERE w.id = ANY(%(ids)s::text[]) AND w.state <> 'gone'
 ORDER BY w.id;

-- name: worker_peers
-- The live daemons a daemon ranks when it decides whose a wake-up is (daemon/peers.py):
-- running (not draining), heartbeating within %(stale_after)s seconds. A heartbeat in the
-- future is no heartbeat: daemons write now() (worker_heartbeat), so such a row was
-- written by hand (a role with the daemon's rights planting peers that never go stale).
SELECT id, queues, handlers, slots FROM @schema@.workers
 WHERE state = 'running' AND heartbeat_at > now() - make_interval(secs => %(stale_after)s)
   AND heartbeat_at <= now() + interval '5 seconds';

-- name: worker_list
-- Live daemons, and those gone within the last hour, with their in-flight job counts,
-- their drain and hand-back requests (0017), the heartbeat interval each keeps and
-- whether it is silent (daemon_silent, 0021).
SELECT w.id, w.host, w.pid, w.version, w.queues, w.handlers, w.slots, w.in_flight, w.state,
       w.drain_requested, w.hand_back_requested_at,
       extract(epoch FROM w.hand_back_grace)::float8 AS hand_back_grace,
       w.hand_back_queues, w.hand_back_handlers,
       w.started_at, w.heartbeat_at, w.stopped_at,
       extract(epoch FROM now() - w.started_at)::float8 AS uptime_seconds,
       extract(epoch FROM now() - w.heartbeat_at)::float8 AS heartbeat_age_seconds,
       extract(epoch FROM w.heartbeat_interval)::float8 AS heartbeat_interval_seconds,
       @schema@.daemon_silent(w) AS silent
  FROM @schema@.workers w
 WHERE w.state <> 'gone' OR w.stopped_at > now() - interval '1 hour'
 ORDER BY w.host, w.started_at;

-- name: worker_wake_channel_set
-- Say in this daemon's row whether it listens on its own wake channel (schema 40); false
-- when the row is not there (register first).
SELECT @schema@.worker_wake_channel_set(%(id)s::text, %(secret)s::text, %(listening)s::boolean);

-- name: worker_schedules_set
-- Record which schedules this daemon declares (shown by `pgworkerd schedules`).
SELECT @schema@.worker_schedules_set_v2(%(id)s::text, %(secret)s::text,
                                        %(schedules)s::text[]);

-- Every statement pgworkerd runs (the migrations under migrations/ aside), each under a
-- "-- name:" header with a one-line description. @schema@ is replaced by the quoted schema
-- name, @schema_literal@ by it as a string literal and @notify_channel@ by the quoted name
-- of the channel enqueue notifies; parameters are psycopg's %(name)s placeholders (so a
-- literal percent sign is written %%).
--
-- Durable whatever the server's default: the claim (claim_jobs, migration 0019, which
-- every language uses) and the daemon's other fenced writes (renew and every finish, the
-- functions of migrations 0019 and 0022 since the daemon role lost UPDATE on jobs) each
-- run `set_config('synchronous_commit', 'on', true)`, the per-transaction form of SET
-- LOCAL (no extra round trip, and safe behind PgBouncer in transaction mode). Its setting
-- holds until the commit of the (implicit) transaction, also when set inside a function
-- (whose SET clause pins only search_path): an acknowledged claim or finish is on disk
-- (and, with synchronous_standby_names, on the standby) even where synchronous_commit =
-- off.

-- name: schema_migrate_lock
-- Serialise migrations of one schema across hosts, until the transaction ends.
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));

-- name: schema_version_table_exists
-- Whether the schema and its version table exist (false before the first migration).
SELECT to_regclass(quote_ident(@schema_literal@) || '.schema_version') IS NOT NULL AS present;

-- name: schema_version_get
-- The highest applied migration, 0 when the version table is empty.
SELECT coalesce(max(version), 0) AS version FROM @schema@.schema_version;

-- name: schema_create
-- The schema itself, before the first migration.
CREATE SCHEMA IF NOT EXISTS @schema@;

-- name: schema_search_path_pin_local
-- For the rest of the transaction, resolve names in pg_catalog only: a fresh install's
-- declared objects bind their names as the functions' pinned search_path would.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- name: schema_version_create
-- The table of applied migrations, before the first migration.
CREATE TABLE @schema@.schema_version (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now());

-- name: schema_version_insert
-- Record one applied migration.
INSERT INTO @schema@.schema_version (version, name) VALUES (%(version)s, %(name)s);

-- name: session_listen
-- Receive the notifications enqueue sends (a hint that due jobs may be waiting).
LISTEN @notify_channel@;

-- name: session_wake_listen
-- Receive the notifications of schema 13's wake trigger and the fleet's own (peers coming
-- and going, drain requests, forwarded wake-ups): JSON payloads, see daemon/peers.py.
LISTEN @wake_channel@;

-- name: wake_send
-- Send a notification on the wake channel (a daemon forwarding a wake-up it cannot take).
SELECT 1 FROM (SELECT pg_notify(@schema_literal@ || '.wake', %(payload)s::text)) AS sent;

-- name: session_read_side_local
-- For the rest of the current transaction: no JIT compilation and no parallel workers.
-- The read side's plans are index scans that stop early, whose cost estimates (the
-- whole range they might read) pass jit_above_cost and the parallel thresholds:
-- compiling a jobs page took seconds on 10 M rows, and workers were launched even for
-- the branches of statuses not asked (a gating filter that is false).
SELECT set_config('jit', 'off', true), set_config('max_parallel_workers_per_gather', '0', true);

-- name: session_statement_timeout_set_local
-- Bound the statements of the current transaction only (PgBouncer may not forward the
-- connection's own statement_timeout startup option).
SELECT set_config('statement_timeout', %(timeout)s, true);

-- name: schema_version_add_compatibility
-- Version tables created before 0.2.0 lack compatible_with (NULL there means the version's
-- own number: only code that knows that version runs against it).
ALTER TABLE @schema@.schema_version ADD COLUMN IF NOT EXISTS compatible_with integer;

-- name: schema_version_set_compatibility
-- Record which older code still runs against the schema once migration %(version)s is in.
UPDATE @schema@.schema_version SET compatible_with = %(compatible_with)s
 WHERE version = %(version)s;

-- name: schema_version_oldest_compatible_code
-- The oldest code (by the latest schema version it knows) that runs against this schema:
-- the highest compatible_with of every applied migration. Read through to_jsonb so that a
-- version table without the column (before 0.2.0) reads as every migration's own number.
SELECT max(coalesce((to_jsonb(v)->>'compatible_with')::integer, v.version))
  FROM @schema@.schema_version v;

-- name: job_enqueue
-- Enqueue one job through the SQL function (the one definition of enqueue).
SELECT @schema@.enqueue(
    handler => %(handler)s, payload => %(payload)s::jsonb, queue => %(queue)s,
    priority => %(priority)s, run_at => %(run_at)s,
    delay => make_interval(secs => %(delay)s), max_attempts => %(max_attempts)s,
    dedupe_key => %(dedupe_key)s) AS id;

-- name: job_enqueue_many
-- Enqueue a JSON array of jobs in one round trip; ids come back in input order.
-- %(jobs)s is JSON text (or jsonb).
SELECT @schema@.enqueue_many(%(jobs)s::jsonb) AS ids;

-- name: job_enqueue_v2
-- job_enqueue with a concurrency key (migration 0009; used only when one is given).
SELECT @schema@.enqueue_v2(
    handler => %(handler)s, payload => %(payload)s::jsonb, queue => %(queue)s,
    priority => %(priority)s, run_at => %(run_at)s,
    delay => make_interval(secs => %(delay)s), max_attempts => %(max_attempts)s,
    dedupe_key => %(dedupe_key)s, concurrency_key => %(concurrency_key)s) AS id;

-- name: job_enqueue_many_v2
-- job_enqueue_many whose job objects may carry "concurrency_key" (migration 0009; used
-- only when one of the jobs has a key).
SELECT @schema@.enqueue_many_v2(%(jobs)s::jsonb) AS ids;

-- name: job_claim
-- Claim up to %(limit)s due jobs for one worker, rescuing expired leases on the way, with
-- claim_jobs (migration 0019), the claim every language uses: claim_v3's one statement
-- (JIT off, its plan kept per session, fleet-wide limits and pauses) behind checked
-- arguments and a durable commit of its own. Each handler claims from its own queues
-- (%(handler_queues)s: JSON, null for all), within its max_running and max_running_per_key
-- (NULL: none). Returns the columns in ClaimedJob's field order.
SELECT * FROM @schema@.claim_jobs(
    worker => %(worker)s::text, queues => %(queues)s::text[], handlers => %(handlers)s::text[],
    lease_seconds => %(lease_seconds)s::float8[], free_slots => %(handler_free)s::integer[],
    max_jobs => %(limit)s::integer, handler_max_attempts => %(max_attempts)s::integer[],
    handler_queues => %(handler_queues)s::jsonb, max_running => %(max_running)s::integer[],
    max_running_per_key => %(max_running_per_key)s::integer[]);

-- name: job_renew
-- Renew many leases of one worker at once, saving progress and checkpoints sent along
-- (NULL keeps the old value); one row per lease: renewed or lost, and cancel requests.
-- Through renew_leases (migration 0022: fenced by the lease, SECURITY DEFINER, the
-- daemon role has no UPDATE on jobs). Like every function that ends or changes a held
-- job, it forces a durable commit (synchronous_commit on for the transaction).
SELECT r.id, r.renewed, r.cancel_requested, r.locked_until
  FROM @schema@.renew_leases(%(worker)s::text, %(ids)s::bigint[], %(tokens)s::bigint[],
                             %(lease_seconds)s::float8[], %(progress)s::jsonb[],
                             %(checkpoints)s::jsonb[]) AS r;

-- name: job_complete
-- Finish jobs their holder still owns: completed, each with an optional JSON result.
-- Returns the ids completed; a missing id means that lease was lost and nothing changed.
-- Through complete_jobs (migration 0022; durable).
SELECT c.id
  FROM @schema@.complete_jobs(%(worker)s::text, %(ids)s::bigint[], %(tokens)s::bigint[],
                              %(results)s::jsonb[], %(progress)s::jsonb[]) AS c(id);

-- name: job_complete_one
-- job_complete for one job, through complete_job (migrations 0019, 0022: one primary-key
-- look-up, no arrays to unpack; durable). Returns the id if the lease held.
SELECT %(id)s::bigint AS id
  FROM @schema@.complete_job(%(id)s::bigint, %(worker)s::text, %(token)s::bigint,
                             %(result)s::jsonb, %(progress)s::jsonb) AS done
 WHERE done;

-- name: job_fail
-- A failed attempt, through fail_job (migrations 0019, 0022): back to pending after
-- exponential backoff with +-25 %% jitter, or dead once max_attempts are used, or
-- cancelled if a cancel was requested meanwhile. The attempt's latest progress and
-- checkpoint are saved with it (NULL keeps the old value), so the next attempt resumes
-- from there. retry_in: seconds until the retry. Durable.
SELECT %(id)s::bigint AS id, f.status, f.run_at,
       CASE WHEN f.status = 'pending' THEN extract(epoch FROM f.run_at - now())::float8
       END AS retry_in
  FROM @schema@.fail_job(%(id)s::bigint, %(worker)s::text, %(token)s::bigint,
                         %(error)s::text, %(backoff_base)s::float8, %(backoff_max)s::float8,
                         %(progress)s::jsonb, %(checkpoint)s::jsonb) AS f;

-- name: job_release
-- Hand a job back (drain, hand-back, shutdown), through release_job (migrations 0019,
-- 0022): pending at once, the attempt not counted, and in its old place in the queue
-- (run_at kept), so the next daemon takes it before newer jobs. Its latest progress and
-- checkpoint are saved (NULL keeps the old value). The peers that serve it are woken on
-- commit as for a new job (the wake channel's {"q", "h", "id", "n"}, see
-- daemon/peers.py), so another daemon starts it at once. Durable.
WITH released AS (
    SELECT %(id)s::bigint AS id, r.status
      FROM @schema@.release_job(%(id)s::bigint, %(worker)s::text, %(token)s::bigint,
                                %(progress)s::jsonb, %(checkpoint)s::jsonb) AS r(status)
)
SELECT r.id, r.status FROM released r
  JOIN @schema@.jobs j ON j.id = r.id, LATERAL (
    SELECT CASE WHEN r.status = 'pending' THEN pg_notify(@schema_literal@ || '.wake',
        CASE WHEN octet_length(j.queue) + octet_length(j.handler) <= 2048
             THEN json_build_object('q', j.queue, 'h', j.handler, 'id', j.id, 'n', 1)
             ELSE json_build_object('id', j.id, 'n', 1) END::text) END) AS sent
 WHERE r.status IS NOT NULL;

-- name: job_cancel_running
-- The holder stopped a job whose cancellation was requested: cancelled (with its latest
-- progress; NULL keeps the old value), through cancel_held_job (migration 0022; durable
-- as job_renew).
SELECT %(id)s::bigint AS id, c.status
  FROM @schema@.cancel_held_job(%(id)s::bigint, %(worker)s::text, %(token)s::bigint,
                                %(error)s::text, %(progress)s::jsonb) AS c(status)
 WHERE c.status IS NOT NULL;

-- name: job_bury
-- The holder cannot run a claimed job at all (its row cannot be loaded or handed to a
-- child): dead at once, whatever attempts are left, with the reason; through give_up_job
-- (migrations 0019, 0022; durable).
SELECT %(id)s::bigint AS id, 'dead' AS status
  FROM @schema@.give_up_job(%(id)s::bigint, %(worker)s::text, %(token)s::bigint,
                            %(error)s::text) AS buried
 WHERE buried;

-- name: job_cancel
-- Cancel jobs by id: pending ones at once, running ones by request to their daemon.
WITH target AS (
    SELECT id FROM @schema@.jobs WHERE id = ANY(%(ids)s::bigint[]) FOR UPDATE
), cancelled AS (
    UPDATE @schema@.jobs j
       SET status = CASE WHEN j.status = 'pending' THEN 'cancelled'
                         ELSE j.status END,
           finished_at = CASE WHEN j.status = 'pending' THEN now() ELSE j.finished_at END,
           cancel_requested = (j.status = 'running'),
           updated_at = now()
      FROM target t
     WHERE j.id = t.id AND j.status IN ('pending', 'running')
    RETURNING j.id, j.status
)
SELECT i.id,
       CASE WHEN j.id IS NULL THEN 'not found'
            WHEN c.status = 'cancelled' THEN 'cancelled'
            WHEN c.status = 'running' THEN 'cancel requested'
            ELSE 'already ' || j.status::text END AS outcome
  FROM unnest(%(ids)s::bigint[]) AS i(id)
  LEFT JOIN cancelled c ON c.id = i.id
  LEFT JOIN @schema@.jobs j ON j.id = i.id;

-- name: job_retry
-- Put dead or cancelled jobs back to pending with fresh attempts and fresh snoozes
-- (a job dead from too many snoozes comes back able to snooze), selected by ids,
-- queue or handler (NULL filters match everything, but at least one is given).
UPDATE @schema@.jobs j
   SET status = 'pending', attempts = 0, snoozes = 0, run_at = now(), finished_at = NULL,
       cancel_requested = false, updated_at = now()
 WHERE j.status IN ('dead', 'cancelled')
   AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s::bigint[]))
   AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
   AND (%(handler)s::text IS NULL OR j.handler = %(handler)s)
   -- a live job of the same handler with the same dedupe key wins (retrying would
   -- duplicate it), and of several finished jobs sharing handler and key only the newest
   -- comes back (keys are scoped per handler, like the unique index)
   AND (j.dedupe_key IS NULL OR (
        NOT EXISTS (SELECT 1 FROM @schema@.jobs live
                     WHERE live.handler = j.handler AND live.dedupe_key = j.dedupe_key
                       AND live.status IN ('pending', 'running'))
        AND j.id = (SELECT max(d.id) FROM @schema@.jobs d
                     WHERE d.handler = j.handler AND d.dedupe_key = j.dedupe_key
                       AND d.status IN ('dead', 'cancelled')
                       AND (%(ids)s::bigint[] IS NULL OR d.id = ANY(%(ids)s::bigint[]))
                       AND (%(queue)s::text IS NULL OR d.queue = %(queue)s)
                       AND (%(handler)s::text IS NULL OR d.handler = %(handler)s))))
RETURNING j.id;

-- name: job_prune
-- Delete up to %(batch)s finished jobs (of the given statuses) finished before the cutoff.
DELETE FROM @schema@.jobs
 WHERE id IN (SELECT id FROM @schema@.jobs
               WHERE finished_at < now() - make_interval(secs => %(older_than)s)
                 AND status = ANY(%(statuses)s::@schema@.job_status[])
               LIMIT %(batch)s)
RETURNING id;

-- name: job_prune_finished
-- The fleet's own retention (migrations 0014, 0020): delete one batch of finished jobs
-- past their retention (seconds per final status; NULL keeps it), one of schedule runs
-- and one of gone daemons' registry rows, by one daemon at a time: the counts are NULL
-- when another holds the lock. live_daemons: the registry's daemons not gone (each daemon
-- spaces its calls by it).
SELECT deleted, schedule_runs_deleted, daemons_deleted, live_daemons
  FROM @schema@.prune_finished_v2(%(completed)s::float8, %(cancelled)s::float8,
                                  %(dead)s::float8, %(schedule_runs)s::float8,
                                  %(gone_daemons)s::float8, %(batch)s::integer);

-- name: job_get
-- One job, every column.
SELECT * FROM @schema@.jobs WHERE id = %(id)s;

-- name: job_lease_state
-- Who holds a job and under which token: what a rejected outcome is checked against
-- (never the payload or other values that a poison row may hold).
SELECT status::text AS status, lease_token, locked_by
  FROM @schema@.jobs WHERE id = %(id)s;

-- name: job_list
-- Jobs filtered by status, queue and handler (NULL matches all), newest first.
SELECT id, queue, handler, status, priority, attempts, max_attempts, run_at, locked_by,
       locked_until, progress, last_error, created_at, started_at, finished_at,
       concurrency_key
  FROM @schema@.jobs
 WHERE (%(statuses)s::@schema@.job_status[] IS NULL
        OR status = ANY(%(statuses)s::@schema@.job_status[]))
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(handler)s::text IS NULL OR handler = %(handler)s)
 ORDER BY id DESC
 LIMIT %(limit)s;

-- name: job_counts
-- Number of jobs per queue and status.
SELECT queue, status::text AS status, count(*) AS jobs
  FROM @schema@.jobs GROUP BY queue, status ORDER BY queue, status;

-- name: job_next_run_at
-- Seconds until the earliest future run_at among pending jobs this worker could claim (NULL
-- when there is none), and the running job whose lease ends first (NULLs: none). One row; measured by the server's clock, so no second round trip to
-- read it). The pending index
-- is ordered (handler, priority, run_at), so a plain min(run_at) would read every pending
-- job of the handlers (a million scheduled jobs: a million index entries, after every
-- claim). Instead: walk the distinct priorities of each handler (one index probe each,
-- a skip scan) and take the first future run_at within each. Measured with 100,000
-- scheduled jobs of one handler: in 65 priorities the walk read 500 buffers (1.3 ms), a
-- plain min() 1,666 (40 ms); in 1,000 priorities 17 ms against 37 ms; in 10,000
-- priorities (10 jobs each) 129 ms against 48 ms. So a handler with more than 1,000
-- distinct pending priorities is looked up the plain way: the walk stays bounded.
WITH RECURSIVE priorities AS (
    SELECT h.handler, 1 AS step,
           (SELECT min(j.priority) FROM @schema@.jobs j
             WHERE j.status = 'pending' AND j.handler = h.handler) AS priority
      FROM unnest(%(handlers)s::text[]) AS h(handler)
    UNION ALL
    SELECT p.handler, p.step + 1,
           (SELECT min(j.priority) FROM @schema@.jobs j
             WHERE j.status = 'pending' AND j.handler = p.handler AND j.priority > p.priority)
      FROM priorities p
     WHERE p.priority IS NOT NULL AND p.step <= 1000
), walked AS (
    SELECT p.handler, p.priority FROM priorities p
     WHERE p.priority IS NOT NULL AND p.step <= 1000
       AND NOT EXISTS (SELECT 1 FROM priorities q
                        WHERE q.handler = p.handler AND q.step > 1000 AND q.priority IS NOT NULL)
), unwalked AS (
    SELECT DISTINCT p.handler FROM priorities p WHERE p.step > 1000 AND p.priority IS NOT NULL
)
SELECT (SELECT extract(epoch FROM next.run_at - now())::float8 FROM (SELECT least(
    (SELECT min(first.run_at)
       FROM walked p CROSS JOIN LATERAL (
           SELECT j.run_at FROM @schema@.jobs j
            WHERE j.status = 'pending' AND j.handler = p.handler AND j.priority = p.priority
              AND j.run_at > now() AND j.queue = ANY(%(queues)s::text[])
            ORDER BY j.run_at
            LIMIT 1) first),
    (SELECT min(j.run_at) FROM @schema@.jobs j JOIN unwalked u USING (handler)
      WHERE j.status = 'pending' AND j.run_at > now()
        AND j.queue = ANY(%(queues)s::text[]))
) AS run_at) next
 -- 'infinity' is never due: no wake-up for it (and no interval to compute)
 WHERE isfinite(next.run_at)) AS wait_seconds,
       -- and the running job of these queues and handlers whose lease runs out first
       -- (jobs_running_lease_idx, in lease order): a dead host's job is claimable from
       -- then on, so one daemon wakes for it (a rescue) instead of waiting for a poll
       r.id, r.queue, r.handler, r.locked_by,
       extract(epoch FROM r.locked_until - now())::float8 AS expires_in
  FROM (SELECT 1) AS one
  LEFT JOIN LATERAL (
      SELECT j.id, j.queue, j.handler, j.locked_by, j.locked_until FROM @schema@.jobs j
       WHERE j.status = 'running' AND j.locked_until IS NOT NULL
         AND j.handler = ANY(%(handlers)s::text[]) AND j.queue = ANY(%(queues)s::text[])
       ORDER BY j.locked_until
       LIMIT 1) r ON true;

-- name: worker_register
-- Record a daemon in the registry, or record it again after it was marked gone.
-- drain_requested is kept then: a drained daemon marked gone during an outage comes back
-- drained. A restarted daemon has a new id, so it starts undrained. Its peers hear of it
-- on the wake channel ({"peer": "up", ...}; just the id when its lists are too long for
-- a payload, and they read the registry then).
WITH registered AS (
    INSERT INTO @schema@.workers AS w (id, host, pid, version, queues, handlers, slots, state,
                                       handler_settings, heartbeat_interval)
    VALUES (%(id)s, %(host)s, %(pid)s, %(version)s, %(queues)s, %(handlers)s, %(slots)s,
            %(state)s, %(settings)s::jsonb,
            make_interval(secs => %(heartbeat_interval)s::float8))
    ON CONFLICT (id) DO UPDATE
       SET state = excluded.state, queues = excluded.queues, handlers = excluded.handlers,
           slots = excluded.slots, handler_settings = excluded.handler_settings,
           heartbeat_interval = excluded.heartbeat_interval,
           heartbeat_at = now(), stopped_at = NULL
    RETURNING w.id, w.queues, w.handlers, w.slots
)
SELECT r.id FROM registered r, LATERAL (
    SELECT pg_notify(@schema_literal@ || '.wake', CASE
        WHEN octet_length(array_to_string(r.queues, ',') || array_to_string(r.handlers, ','))
             < 6000
        THEN json_build_object('peer', 'up', 'id', r.id, 'queues', r.queues,
                               'handlers', r.handlers, 'slots', r.slots)
        ELSE json_build_object('peer', 'up', 'id', r.id) END::text)) AS sent;

-- name: worker_heartbeat
-- Record this daemon's state and in-flight jobs, and the most it lets pass before its
-- next heartbeat (%(heartbeat_interval)s seconds; migration 0021); returns the drain
-- requested of it: the plain drain flag and the hand-back request (0017; grace in
-- seconds, NULL: each handler's stop_grace). The hand-back request is marked seen:
-- `drain --wait` waits for it.
UPDATE @schema@.workers
   SET state = %(state)s, in_flight = %(in_flight)s, queues = %(queues)s,
       handlers = %(handlers)s, slots = %(slots)s, handler_settings = %(settings)s::jsonb,
       heartbeat_interval = make_interval(secs => %(heartbeat_interval)s::float8),
       heartbeat_at = now(), hand_back_seen_at = hand_back_requested_at
 WHERE id = %(id)s AND state <> 'gone'
RETURNING drain_requested, hand_back_requested_at,
          extract(epoch FROM hand_back_grace)::float8 AS hand_back_grace,
          hand_back_queues, hand_back_handlers;

-- name: worker_deregister
-- A daemon that exits cleanly marks itself gone (and its peers hear so: {"peer": "down"}).
WITH gone AS (
    UPDATE @schema@.workers
       SET state = 'gone', in_flight = '{}', stopped_at = now(), heartbeat_at = now()
     WHERE id = %(id)s
    RETURNING id
)
SELECT g.id FROM gone g, LATERAL (
    SELECT pg_notify(@schema_literal@ || '.wake',
                     json_build_object('peer', 'down', 'id', g.id)::text)) AS sent;

-- name: worker_mark_stale
-- Daemons silent for longer than %(stale_after)s seconds are marked gone, by one caller at
-- a time: under a transaction-level advisory lock keyed by the schema, so that a caller
-- that finds it taken marks nothing (no row) instead of waiting. Served by
-- workers_live_idx (0007). Peers hear of each on the wake channel ({"peer": "down"}).
WITH gone AS (
    UPDATE @schema@.workers
       SET state = 'gone', stopped_at = now()
     WHERE (SELECT pg_try_advisory_xact_lock(
                hashtextextended('pgworkerd.registry.mark_stale:' || @schema_literal@, 0)))
       AND state <> 'gone' AND heartbeat_at < now() - make_interval(secs => %(stale_after)s)
    RETURNING id, host, pid
)
SELECT g.id, g.host, g.pid FROM gone g, LATERAL (
    SELECT pg_notify(@schema_literal@ || '.wake',
                     json_build_object('peer', 'down', 'id', g.id)::text)) AS sent;

-- name: worker_prune_gone
-- Delete the rows of daemons gone (stopped or marked gone) over %(older_than)s seconds
-- ago; returns how many.
WITH pruned AS (
    DELETE FROM @schema@.workers
     WHERE state = 'gone'
       AND coalesce(stopped_at, heartbeat_at) < now() - make_interval(secs => %(older_than)s)
    RETURNING 1
)
SELECT count(*) FROM pruned;

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

-- name: job_running_list
-- Running jobs with their holder, age and progress, their lease's end, and whether the
-- daemon holding them is silent (daemon_silent, 0021; false when the holder has no
-- registry row: a worker in another language promises no heartbeat).
SELECT j.id, j.queue, j.handler, j.attempts, j.max_attempts, j.locked_by, j.progress,
       j.cancel_requested, j.locked_until,
       extract(epoch FROM now() - j.started_at)::float8 AS age_seconds,
       extract(epoch FROM j.locked_until - now())::float8 AS lease_left_seconds,
       w.host AS daemon_host,
       extract(epoch FROM now() - w.heartbeat_at)::float8 AS daemon_heartbeat_age_seconds,
       coalesce(@schema@.daemon_silent(w), false) AS daemon_silent
  FROM @schema@.jobs j
  LEFT JOIN @schema@.workers w ON w.id = j.locked_by
 WHERE j.status = 'running'
 ORDER BY j.started_at;

-- name: job_daemon
-- The registry row of the daemon holding job %(id)s (no row: the job is not held, or its
-- holder has no registry row), with whether it is silent (daemon_silent, 0021): what
-- `show` and the job page say about it.
SELECT w.id, w.host, w.pid, w.state, w.heartbeat_at,
       extract(epoch FROM now() - w.heartbeat_at)::float8 AS heartbeat_age_seconds,
       extract(epoch FROM w.heartbeat_interval)::float8 AS heartbeat_interval_seconds,
       @schema@.daemon_silent(w) AS silent,
       j.locked_until,
       extract(epoch FROM j.locked_until - now())::float8 AS lease_left_seconds
  FROM @schema@.jobs j JOIN @schema@.workers w ON w.id = j.locked_by
 WHERE j.id = %(id)s AND j.status = 'running';

-- name: job_silent_count
-- For the metrics: running jobs whose daemon is silent (daemon_silent, 0021), and how
-- many daemons hold them. Every live daemon reads it every queue_depth_interval, so it
-- costs the registry (one row per daemon, gone ones until pruned) and the silent
-- daemons' jobs, never every running job of the fleet: a silent daemon's jobs are the
-- ones its last heartbeat listed (in_flight), each checked by primary key to still be
-- running under it. (A job claimed within the second before a kill, before the heartbeat
-- that lists it, is missed here; `explain` and `status` read from the job's side.)
-- A subquery per silent daemon, so that its jobs are looked up by primary key (as a
-- join, the planner hashes the daemons and reads every running job: 48 ms at 16,000).
SELECT coalesce(sum(s.held), 0)::bigint AS jobs,
       count(*) FILTER (WHERE s.held > 0) AS daemons
  FROM @schema@.workers w
 CROSS JOIN LATERAL (
       SELECT count(*) AS held FROM @schema@.jobs j
        WHERE j.id = ANY (w.in_flight) AND j.locked_by = w.id
          AND j.status::text = 'running') s  -- by primary key, never the running index
 WHERE cardinality(w.in_flight) > 0 AND @schema@.daemon_silent(w);

-- name: job_oldest_pending
-- Age of the oldest due pending job (seconds), NULL when none is due. A run_at of
-- '-infinity' (an old or directly inserted row) has no age: now() minus it is an error.
SELECT extract(epoch FROM now() - min(run_at))::float8 AS age_seconds
  FROM @schema@.jobs WHERE status = 'pending' AND run_at <= now() AND isfinite(run_at);

-- name: job_unserved_list
-- Pending jobs whose handler (on their queue) no live daemon serves: the 50 largest
-- groups (names are made up by enqueuers, and status must stay readable), each row with
-- the number of groups in all.
SELECT j.queue, j.handler, count(*) AS jobs, count(*) OVER () AS groups,
       extract(epoch FROM now() - min(j.created_at))::float8 AS oldest_seconds
  FROM @schema@.jobs j
 WHERE j.status = 'pending'
   AND NOT EXISTS (SELECT 1 FROM @schema@.workers w
                    WHERE w.state <> 'gone' AND j.handler = ANY(w.handlers)
                      AND j.queue = ANY(w.queues))
 GROUP BY j.queue, j.handler
 ORDER BY count(*) DESC, j.queue, j.handler
 LIMIT 50;

-- name: job_counts_capped
-- Jobs per queue and status for the metrics gauge, with a bounded number of queues however
-- many the table holds (an enqueuer picks queue names freely): the queues in %(served)s,
-- the %(top)s other queues with the most jobs, and every other queue summed under queue
-- NULL (labelled "other"). Ranked and summed here, so the daemon receives at most
-- (served + top + 1) x statuses rows, never a row per queue.
WITH per_queue AS (
    SELECT queue, status, count(*) AS jobs
      FROM @schema@.jobs GROUP BY queue, status
), top_queues AS (
    SELECT queue FROM per_queue
     WHERE queue <> ALL (%(served)s::text[])
     GROUP BY queue
     ORDER BY sum(jobs) DESC, queue
     LIMIT %(top)s
)
SELECT CASE WHEN p.queue = ANY (%(served)s::text[]) OR t.queue IS NOT NULL THEN p.queue END
           AS queue,
       p.status::text AS status, sum(p.jobs)::bigint AS jobs
  FROM per_queue p LEFT JOIN top_queues t ON t.queue = p.queue
 GROUP BY 1, 2
 ORDER BY 1, 2;

-- Pausing queues and handlers (migration 0009).

-- name: paused_set
-- Pause (%(pause)s true) or resume a queue or handler; true when that changed something.
-- A resume also wakes the daemons of schema 13 on (resume() notifies the old channel).
SELECT c.changed FROM (
    SELECT CASE WHEN %(pause)s THEN @schema@.pause(%(kind)s, %(name)s, %(comment)s)
                ELSE @schema@.resume(%(kind)s, %(name)s) END AS changed) c
  LEFT JOIN LATERAL (
    SELECT pg_notify(@schema_literal@ || '.wake', '{}') WHERE c.changed AND NOT %(pause)s
  ) AS sent ON true;

-- name: paused_target_served
-- Whether a live daemon serves queue or handler %(name)s (%(kind)s): `pause` warns about
-- a name none does (a typo pauses nothing anyone runs, and says so).
SELECT EXISTS (SELECT 1 FROM @schema@.workers w
                WHERE w.state <> 'gone'
                  AND CASE WHEN %(kind)s = 'queue' THEN w.queues ELSE w.handlers END
                      @> ARRAY[%(name)s::text]) AS served;

-- name: paused_list
-- What is paused, oldest first, as `status` shows it.
SELECT kind, name, paused_at, paused_by, comment,
       extract(epoch FROM now() - paused_at)::float8 AS paused_seconds
FROM @schema@.paused ORDER BY paused_at, kind, name;
-- -- schedules (periodic jobs) -------------------------------------------------------------

-- name: schedule_declare
-- Record this daemon's definition of a schedule; returns the tick up to which the schedule
-- is handled (its latest run, or when it was first declared).
SELECT @schema@.schedule_declare(%(name)s, %(definition)s::jsonb, %(worker)s) AS handled_until;

-- name: schedule_declared
-- Whether this role may declare schedules (an operator; the daemon role may not since
-- schema 22), and the stored definition of one (NULL: not declared) with the tick up to
-- which it is handled (its latest run, or when it was first declared).
SELECT has_function_privilege(@schema_literal@ || '.schedule_declare(text, jsonb, text)',
                              'EXECUTE') AS may_declare,
       s.definition,
       greatest(s.created_at, (SELECT max(r.tick) FROM @schema@.schedule_runs r
                                WHERE r.schedule = s.name)) AS handled_until
  FROM (SELECT) AS one
  LEFT JOIN @schema@.schedules s ON s.name = %(name)s;

-- name: schedule_fire
-- Fire one tick of a schedule an operator declared, its job and overlap policy taken from
-- the stored definition (migration 0022, schedule_fire_v2): record it and enqueue its job
-- in one transaction; returns outcome fired / skipped / taken and the job id.
SELECT outcome, job_id
  FROM @schema@.schedule_fire_v2(%(name)s, %(tick)s, %(worker)s);

-- name: schedule_list
-- Every schedule with its last run, that run's job status, and whether a live daemon
-- declares it now (its name among a live daemon's schedules).
SELECT s.name, s.definition, s.declared_by, s.declared_at, s.created_at,
       r.tick AS last_tick, r.job_id AS last_job_id, r.skipped AS last_skipped,
       r.fired_by AS last_fired_by, j.status::text AS last_job_status,
       (SELECT count(*) FROM @schema@.schedule_runs c WHERE c.schedule = s.name) AS runs,
       EXISTS (SELECT 1 FROM @schema@.workers w
                WHERE w.state <> 'gone' AND w.schedules @> ARRAY[s.name]) AS declared_now
  FROM @schema@.schedules s
  LEFT JOIN LATERAL (SELECT * FROM @schema@.schedule_runs r
                      WHERE r.schedule = s.name ORDER BY r.tick DESC LIMIT 1) r ON true
  LEFT JOIN @schema@.jobs j ON j.id = r.job_id
 ORDER BY s.name;

-- name: schedule_runs_prune
-- Delete schedule run rows older than %(older_than)s seconds, keeping each schedule's
-- latest; returns how many. Runs whose job is still pending or running are kept, and so
-- every newer run: overlap (schedule_fire) finds a schedule's unfinished job through its
-- run among the latest 100 that created one, so a job older than the retention (a
-- week-long run, or one held by a paused queue) must keep it, or the next tick starts a
-- second one. The function (migration 0010) deletes by age alone; now() is the same
-- inside it, so the oldest such run is exactly kept.
SELECT @schema@.schedule_runs_prune(greatest(
           make_interval(secs => %(older_than)s),
           (SELECT now() - min(recent.fired_at)
              FROM @schema@.schedules s
             CROSS JOIN LATERAL (SELECT r.job_id, r.fired_at FROM @schema@.schedule_runs r
                                  WHERE r.schedule = s.name AND r.job_id IS NOT NULL
                                  ORDER BY r.tick DESC LIMIT 100) recent
              JOIN @schema@.jobs j ON j.id = recent.job_id
             WHERE j.status IN ('pending', 'running')))) AS deleted;

-- name: worker_schedules_set
-- Record which schedules this daemon declares (shown by `pgworkerd schedules`).
UPDATE @schema@.workers SET schedules = %(schedules)s WHERE id = %(id)s;
-- Handler-controlled outcomes (schema 9, migration "outcomes") ---------------------------

-- name: job_snooze
-- The handler asked to run again in %(delay)s seconds (pgworkerd.Snooze), which is not a
-- failure, through snooze_held_job (migration 0022; durable): pending again
-- at now() + delay with the attempt not counted and one more snooze counted (cancelled
-- instead if a cancel was requested meanwhile), its latest progress and checkpoint saved
-- (NULL keeps the old value), last_error kept. Only while the job has snoozed fewer than
-- %(max_snoozes)s times: no row back then, and the daemon records the attempt as failed
-- instead (a lost lease also gives no row: job_fail, under the same fence, changes
-- nothing either). retry_in: seconds until it is due.
SELECT %(id)s::bigint AS id, s.status, s.run_at, s.snoozes,
       CASE WHEN s.status = 'pending' THEN extract(epoch FROM s.run_at - now())::float8
       END AS retry_in
  FROM @schema@.snooze_held_job(%(id)s::bigint, %(worker)s::text, %(token)s::bigint,
                                %(delay)s::float8, %(max_snoozes)s::integer,
                                %(progress)s::jsonb, %(checkpoint)s::jsonb) AS s;

-- name: job_info
-- One job as pgworkerd.get returns it (client.JobInfo's fields, in order), through the
-- function of migration 0018: every job for a role that may read the jobs table, only its
-- own for an enqueuer (no row otherwise, as for an unknown id).
SELECT * FROM @schema@.job_get_v1(%(id)s);

-- name: session_finished_listening
-- Whether this session listens on the channel of finished jobs already (pgworkerd.wait
-- then neither LISTENs nor UNLISTENs: it leaves the caller's session as it found it).
SELECT %(channel)s::text = ANY (ARRAY(SELECT pg_listening_channels())) AS listening;

-- name: session_finished_listen
-- Receive the notification of every job reaching a final status (payload: its id);
-- @finished_channel@ is the quoted name of that channel (queries.finished_channel).
LISTEN @finished_channel@;

-- name: session_finished_unlisten
-- Stop receiving them again.
UNLISTEN @finished_channel@;

-- name: attempt_account
-- Add what the daemon measured to attempts its trigger recorded (migration 0012), through
-- attempt_account_v1 (0022): each names the job and the lease token it ran under, and
-- this worker, so a figure lands on its own attempt only, also one another daemon's
-- claim ended (lease expired). Returns the rows changed.
SELECT a.job_id
  FROM @schema@.attempt_account_v1(%(worker)s::text, %(ids)s::bigint[], %(tokens)s::bigint[],
                                   %(wall)s::float8[], %(cpu_user)s::float8[],
                                   %(cpu_system)s::float8[], %(peak_memory)s::bigint[])
       AS a(job_id);

-- name: attempt_list
-- A job's attempts, oldest first (pgworkerd show).
SELECT attempt, outcome, worker, host, started_at, finished_at, wall_seconds,
       cpu_user_seconds, cpu_system_seconds, peak_memory, error
  FROM @schema@.attempts
 WHERE job_id = %(id)s
 ORDER BY finished_at, lease_token;

-- name: job_log_write
-- Upsert running and ended attempts' captured output (migration 0015), every attempt in
-- one statement, through job_log_write_v1 (0022): only attempts this worker holds or held
-- (the attempt history names it), never another worker's row. A NULL (or empty) head
-- keeps the stored one (a head only grows, and once full it is sent no more, so its
-- TOASTed value is not rewritten every second). Attempts of jobs deleted meanwhile are
-- skipped, so a log never outlives its job. Returns the job ids written.
SELECT l.job_id
  FROM @schema@.job_log_write_v1(%(worker)s::text, %(ids)s::bigint[], %(tokens)s::bigint[],
                                 %(attempts)s::integer[], %(heads)s::text[],
                                 %(tails)s::text[], %(totals)s::bigint[],
                                 %(omitted)s::bigint[], %(finished)s::boolean[]) AS l(job_id);

-- name: job_log_list
-- A job's captured output, one row per attempt that printed something, oldest first
-- (pgworkerd logs, the dashboard); %(attempt)s NULL for every attempt.
SELECT attempt, lease_token, worker, head, tail, total_bytes, omitted_bytes, finished,
       updated_at
  FROM @schema@.job_logs
 WHERE job_id = %(id)s AND (%(attempt)s::integer IS NULL OR attempt = %(attempt)s)
 ORDER BY lease_token;

-- name: job_log_state
-- Whether a job exists, and the attempt it runs now (for `logs --follow`).
SELECT status::text AS status, attempts, lease_token
  FROM @schema@.jobs WHERE id = %(id)s;

-- -- the read side: `status`, `show`, `jobs`, `explain` and the dashboard (views.py) ------

-- name: role_writes
-- What the session's role could change through the schema (a read-only dashboard's
-- role must be able to change nothing: `[web] read_only` refuses one that can, N9): the
-- names of the rights it holds, empty for pgworkerd_reader. Any write on a table, any
-- column UPDATE, and EXECUTE on a VOLATILE SECURITY DEFINER function (the others run
-- with the caller's rights, or change nothing: job_get_v1 is STABLE).
SELECT ARRAY(
    SELECT c.relname || ': ' || p.privilege
      FROM pg_catalog.pg_class c
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     CROSS JOIN unnest(ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE']) AS p(privilege)
     WHERE n.nspname = @schema_literal@ AND c.relkind IN ('r', 'p')
       AND (pg_catalog.has_table_privilege(c.oid, p.privilege)
            OR (p.privilege IN ('INSERT', 'UPDATE')
                AND pg_catalog.has_any_column_privilege(c.oid, p.privilege)))
    UNION ALL
    SELECT f.oid::pg_catalog.regprocedure::text || ': EXECUTE'
      FROM pg_catalog.pg_proc f
      JOIN pg_catalog.pg_namespace n ON n.oid = f.pronamespace
     WHERE n.nspname = @schema_literal@ AND f.provolatile = 'v' AND f.prokind = 'f'
       AND f.prosecdef
       AND f.prorettype <> 'pg_catalog.trigger'::pg_catalog.regtype
       AND pg_catalog.has_function_privilege(f.oid, 'EXECUTE')
     ORDER BY 1) AS rights;

-- name: view_job_counts_recent_capped
-- job_counts_capped with the finished jobs of the last %(window)s seconds only: pending
-- and running counted through their partial indexes, finished ones through
-- jobs_finished_at_idx, so the count costs the backlog and the recent history, never the
-- whole table (10 M finished jobs: a full count reads every row).
WITH per_queue AS (
    SELECT queue, 'pending'::text AS status, count(*) AS jobs
      FROM @schema@.jobs WHERE status = 'pending' GROUP BY queue
    UNION ALL
    SELECT queue, 'running', count(*)
      FROM @schema@.jobs WHERE status = 'running' GROUP BY queue
    UNION ALL
    SELECT queue, status::text, count(*)
      FROM @schema@.jobs
     WHERE finished_at > now() - make_interval(secs => %(window)s)
       AND status IN ('completed', 'dead', 'cancelled')
     GROUP BY queue, status
), top_queues AS (
    SELECT queue FROM per_queue
     WHERE queue <> ALL (%(served)s::text[])
     GROUP BY queue
     ORDER BY sum(jobs) DESC, queue
     LIMIT %(top)s
)
SELECT CASE WHEN p.queue = ANY (%(served)s::text[]) OR t.queue IS NOT NULL THEN p.queue END
           AS queue,
       p.status, sum(p.jobs)::bigint AS jobs
  FROM per_queue p LEFT JOIN top_queues t ON t.queue = p.queue
 GROUP BY 1, 2
 ORDER BY 1, 2;

-- name: view_queue_oldest_due
-- Per queue of %(queues)s with a due pending job: the age (seconds) of its oldest. One
-- pass over the backlog's due rows (the partial pending index holds no finished job).
SELECT j.queue, extract(epoch FROM now() - min(j.run_at))::float8 AS oldest_due_seconds
  FROM @schema@.jobs j
 WHERE j.status = 'pending' AND j.run_at <= now() AND isfinite(j.run_at)
   AND j.queue = ANY(%(queues)s::text[])
 GROUP BY j.queue;

-- name: view_throughput
-- Ended attempts per minute over the last %(minutes)s minutes, oldest first, every minute
-- a row (outcomes: {outcome: attempts}, '{}' for a quiet minute): the throughput and
-- failure chart. The attempts of migration 0012, through attempts_finished_at_idx (0016).
WITH minutes AS (
    SELECT generate_series(date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1),
                           date_trunc('minute', now()), interval '1 minute') AS minute
), ended AS (
    SELECT date_trunc('minute', a.finished_at) AS minute, a.outcome, count(*) AS n
      FROM @schema@.attempts a
     WHERE a.finished_at >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
     GROUP BY 1, 2
)
SELECT m.minute,
       coalesce(jsonb_object_agg(e.outcome, e.n) FILTER (WHERE e.outcome IS NOT NULL), '{}')
           AS outcomes
  FROM minutes m LEFT JOIN ended e USING (minute)
 GROUP BY m.minute
 ORDER BY m.minute;

-- name: view_job_page_older
-- One page of the jobs list, newest first, ids below %(before)s (NULL: from the newest).
-- One branch per status, each kept only when its status is asked (%(statuses)s) and each
-- stopping at %(limit)s rows: with its status a constant, the planner picks per branch
-- from the statistics: the primary key backwards for a common status (completed),
-- jobs_status_id_idx for a rare one (running, dead), jobs_queue_status_id_idx or
-- jobs_handler_status_id_idx with a queue or handler (0016). (One lateral
-- scan per status would plan every status alike, and read a whole table of completed
-- jobs to find the 40 running ones.) The text filter (%(text)s, NULL: none) matches the
-- first %(text_chars)s characters of the payload's JSON text or of the last error (a
-- multi-MB payload is not lowercased whole), case-insensitive, as a plain substring
-- (strpos: no pattern characters); no index serves it, so the scan runs until the page
-- is full and the caller bounds it by a statement timeout. Run unprepared
-- (prepare=False): the values are then in the plan, and what is not asked folds away
-- (compared as text: a cast to the enum is not immutable, and would leave every
-- branch in the plan behind a run-time filter). Run after session_read_side_local.
WITH page AS NOT MATERIALIZED (
    SELECT j.id, j.queue, j.handler, j.status, j.priority, j.attempts, j.max_attempts,
           j.run_at, j.locked_by, j.locked_until, j.progress, j.last_error, j.created_at,
           j.started_at, j.finished_at, j.concurrency_key
      FROM @schema@.jobs j
     WHERE (%(before)s::bigint IS NULL OR j.id < %(before)s::bigint)
       AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
       AND (%(handler)s::text IS NULL OR j.handler = %(handler)s::text)
       AND (%(text)s::text IS NULL
            OR strpos(lower(left(j.payload::text, %(text_chars)s)), lower(%(text)s::text)) > 0
            OR strpos(lower(left(j.last_error, %(text_chars)s)), lower(%(text)s::text)) > 0)
)
SELECT * FROM (
      (SELECT * FROM page WHERE status = 'pending'
                  AND 'pending' = ANY(%(statuses)s::text[])
                ORDER BY id DESC LIMIT %(limit)s)
UNION ALL (SELECT * FROM page WHERE status = 'running'
                  AND 'running' = ANY(%(statuses)s::text[])
                ORDER BY id DESC LIMIT %(limit)s)
UNION ALL (SELECT * FROM page WHERE status = 'completed'
                  AND 'completed' = ANY(%(statuses)s::text[])
                ORDER BY id DESC LIMIT %(limit)s)
UNION ALL (SELECT * FROM page WHERE status = 'dead'
                  AND 'dead' = ANY(%(statuses)s::text[])
                ORDER BY id DESC LIMIT %(limit)s)
UNION ALL (SELECT * FROM page WHERE status = 'cancelled'
                  AND 'cancelled' = ANY(%(statuses)s::text[])
                ORDER BY id DESC LIMIT %(limit)s)
) p
 ORDER BY p.id DESC
 LIMIT %(limit)s;

-- name: view_job_page_newer
-- view_job_page_older the other way: the %(limit)s jobs just above id %(after)s, oldest
-- first (the caller turns the page round, so it reads newest first like any other).
WITH page AS NOT MATERIALIZED (
    SELECT j.id, j.queue, j.handler, j.status, j.priority, j.attempts, j.max_attempts,
           j.run_at, j.locked_by, j.locked_until, j.progress, j.last_error, j.created_at,
           j.started_at, j.finished_at, j.concurrency_key
      FROM @schema@.jobs j
     WHERE j.id > %(after)s::bigint
       AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
       AND (%(handler)s::text IS NULL OR j.handler = %(handler)s::text)
       AND (%(text)s::text IS NULL
            OR strpos(lower(left(j.payload::text, %(text_chars)s)), lower(%(text)s::text)) > 0
            OR strpos(lower(left(j.last_error, %(text_chars)s)), lower(%(text)s::text)) > 0)
)
SELECT * FROM (
      (SELECT * FROM page WHERE status = 'pending'
                  AND 'pending' = ANY(%(statuses)s::text[])
                ORDER BY id ASC LIMIT %(limit)s)
UNION ALL (SELECT * FROM page WHERE status = 'running'
                  AND 'running' = ANY(%(statuses)s::text[])
                ORDER BY id ASC LIMIT %(limit)s)
UNION ALL (SELECT * FROM page WHERE status = 'completed'
                  AND 'completed' = ANY(%(statuses)s::text[])
                ORDER BY id ASC LIMIT %(limit)s)
UNION ALL (SELECT * FROM page WHERE status = 'dead'
                  AND 'dead' = ANY(%(statuses)s::text[])
                ORDER BY id ASC LIMIT %(limit)s)
UNION ALL (SELECT * FROM page WHERE status = 'cancelled'
                  AND 'cancelled' = ANY(%(statuses)s::text[])
                ORDER BY id ASC LIMIT %(limit)s)
) p
 ORDER BY p.id ASC
 LIMIT %(limit)s;

-- name: view_job_text_older
-- view_job_page_older for a text search over statuses that include completed: one
-- backward scan of the primary key over every status asked, which stops at %(limit)s
-- matches. (By status, the completed branch, most of the table, would be read to its end
-- whenever fewer of its jobs match than a page holds.) The caller bounds it by a
-- statement timeout. Run unprepared, after session_read_side_local.
SELECT j.id, j.queue, j.handler, j.status, j.priority, j.attempts, j.max_attempts,
       j.run_at, j.locked_by, j.locked_until, j.progress, j.last_error, j.created_at,
       j.started_at, j.finished_at, j.concurrency_key
  FROM @schema@.jobs j
 WHERE (%(before)s::bigint IS NULL OR j.id < %(before)s::bigint)
   AND j.status::text = ANY(%(statuses)s::text[])
   AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
   AND (%(handler)s::text IS NULL OR j.handler = %(handler)s::text)
   AND (strpos(lower(left(j.payload::text, %(text_chars)s)), lower(%(text)s::text)) > 0
        OR strpos(lower(left(j.last_error, %(text_chars)s)), lower(%(text)s::text)) > 0)
 ORDER BY j.id DESC
 LIMIT %(limit)s;

-- name: view_job_text_newer
-- view_job_text_older the other way: the %(limit)s matches just above id %(after)s,
-- oldest first (the caller turns the page round).
SELECT j.id, j.queue, j.handler, j.status, j.priority, j.attempts, j.max_attempts,
       j.run_at, j.locked_by, j.locked_until, j.progress, j.last_error, j.created_at,
       j.started_at, j.finished_at, j.concurrency_key
  FROM @schema@.jobs j
 WHERE j.id > %(after)s::bigint
   AND j.status::text = ANY(%(statuses)s::text[])
   AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
   AND (%(handler)s::text IS NULL OR j.handler = %(handler)s::text)
   AND (strpos(lower(left(j.payload::text, %(text_chars)s)), lower(%(text)s::text)) > 0
        OR strpos(lower(left(j.last_error, %(text_chars)s)), lower(%(text)s::text)) > 0)
 ORDER BY j.id ASC
 LIMIT %(limit)s;

-- name: view_limits
-- The fleet-wide limits live daemons declare (handler_settings, migration 0016), per
-- handler: the strictest max_running and max_running_per_key any live daemon claims
-- with, how many daemons declare one, and the current leases (the claim's count:
-- running with a lease not yet over; jobs_running_handler_key_idx). Values a daemon
-- wrote that are not whole numbers are ignored.
WITH declared AS (
    SELECT s.key AS handler, w.id AS daemon,
           CASE WHEN jsonb_typeof(s.value -> 'max_running') = 'number'
                THEN (s.value ->> 'max_running')::numeric END AS max_running,
           CASE WHEN jsonb_typeof(s.value -> 'max_running_per_key') = 'number'
                THEN (s.value ->> 'max_running_per_key')::numeric END AS per_key
      FROM @schema@.workers w
     CROSS JOIN LATERAL jsonb_each(CASE WHEN jsonb_typeof(w.handler_settings) = 'object'
                                        THEN w.handler_settings ELSE '{}' END) AS s
     WHERE w.state <> 'gone' AND jsonb_typeof(s.value) = 'object'
)
SELECT d.handler,
       min(d.max_running)::bigint AS max_running,
       min(d.per_key)::bigint AS max_running_per_key,
       count(*) AS daemons,
       (SELECT count(*) FROM @schema@.jobs r
         WHERE r.status = 'running' AND r.handler = d.handler AND r.locked_until > now())
           AS running,
       (SELECT coalesce(jsonb_agg(jsonb_build_object('key', k.concurrency_key,
                                                     'running', k.n) ORDER BY k.n DESC), '[]')
          FROM (SELECT r.concurrency_key, count(*) AS n FROM @schema@.jobs r
                 WHERE r.status = 'running' AND r.handler = d.handler
                   AND r.concurrency_key IS NOT NULL AND r.locked_until > now()
                 GROUP BY r.concurrency_key ORDER BY count(*) DESC, r.concurrency_key
                 LIMIT 20) k) AS busiest_keys
  FROM declared d
 WHERE d.max_running IS NOT NULL OR d.per_key IS NOT NULL
 GROUP BY d.handler
 ORDER BY d.handler;

-- name: view_job_shown
-- One job for the dashboard's page, every value bounded: payload, progress, checkpoint,
-- result and last_error come as text of at most %(shown)s characters (JSON indented when
-- whole, cut as stored when longer), each with its whole length in characters (NULL: no
-- value), so a 30 MB payload never travels to the dashboard. Each JSON value is turned
-- into text once (OFFSET 0 keeps the lateral from being inlined into both uses).
SELECT j.id, j.queue, j.handler, j.status::text AS status, j.priority, j.run_at, j.attempts,
       j.max_attempts, j.locked_by, j.locked_until, j.lease_token, j.cancel_requested,
       j.dedupe_key, j.concurrency_key, j.snoozes, j.created_at, j.started_at,
       j.finished_at, j.updated_at,
       CASE WHEN length(t.payload) <= %(shown)s THEN jsonb_pretty(j.payload)
            ELSE left(t.payload, %(shown)s) END AS payload,
       length(t.payload) AS payload_chars,
       CASE WHEN length(t.progress) <= %(shown)s THEN jsonb_pretty(j.progress)
            ELSE left(t.progress, %(shown)s) END AS progress,
       length(t.progress) AS progress_chars,
       CASE WHEN length(t.checkpoint) <= %(shown)s THEN jsonb_pretty(j.checkpoint)
            ELSE left(t.checkpoint, %(shown)s) END AS checkpoint,
       length(t.checkpoint) AS checkpoint_chars,
       CASE WHEN length(t.result) <= %(shown)s THEN jsonb_pretty(j.result)
            ELSE left(t.result, %(shown)s) END AS result,
       length(t.result) AS result_chars,
       left(j.last_error, %(shown)s) AS last_error, length(j.last_error) AS last_error_chars
  FROM @schema@.jobs j
 CROSS JOIN LATERAL (SELECT j.payload::text AS payload, j.progress::text AS progress,
                            j.checkpoint::text AS checkpoint, j.result::text AS result
                     OFFSET 0) t
 WHERE j.id = %(id)s;

-- name: view_job_value_part
-- %(chars)s characters from character %(start)s (1-based) of one value of a job as text
-- (%(field)s: payload, progress, checkpoint, result or last_error; NULL for another
-- name), and the value's whole length: the dashboard's raw download, read in parts so
-- that neither side holds a large value whole.
SELECT substr(v.value, %(start)s, %(chars)s) AS part, length(v.value) AS chars
  FROM @schema@.jobs j
 CROSS JOIN LATERAL (SELECT CASE %(field)s::text
                              WHEN 'payload' THEN j.payload::text
                              WHEN 'progress' THEN j.progress::text
                              WHEN 'checkpoint' THEN j.checkpoint::text
                              WHEN 'result' THEN j.result::text
                              WHEN 'last_error' THEN j.last_error
                            END AS value
                     OFFSET 0) v
 WHERE j.id = %(id)s;

-- name: view_attempts_shown
-- The newest %(limit)s attempts of a job (oldest of them first, like attempt_list), each
-- error cut to %(shown)s characters with its whole length, and how many there are in all.
SELECT * FROM (
    SELECT attempt, outcome, worker, host, started_at, finished_at, wall_seconds,
           cpu_user_seconds, cpu_system_seconds, peak_memory,
           left(error, %(shown)s) AS error, length(error) AS error_chars,
           count(*) OVER () AS total, lease_token
      FROM @schema@.attempts
     WHERE job_id = %(id)s
     ORDER BY finished_at DESC, lease_token DESC
     LIMIT %(limit)s) a
 ORDER BY a.finished_at, a.lease_token;

-- name: view_job_logs_shown
-- The newest %(limit)s attempts' captured output of a job (oldest of them first): the
-- first %(shown)s characters of the head and the last %(shown)s of the tail, with their
-- whole lengths, and how many attempts printed something in all.
SELECT * FROM (
    SELECT attempt, lease_token, worker, left(head, %(shown)s) AS head,
           length(head) AS head_chars, right(tail, %(shown)s) AS tail,
           length(tail) AS tail_chars, total_bytes, omitted_bytes, finished, updated_at,
           count(*) OVER () AS total
      FROM @schema@.job_logs
     WHERE job_id = %(id)s
     ORDER BY lease_token DESC
     LIMIT %(limit)s) l
 ORDER BY l.lease_token;

-- name: view_job_log_part
-- %(chars)s characters from character %(start)s (1-based) of one attempt's head or tail
-- (%(part)s: head or tail), and its whole length: the raw download of a job's log.
SELECT substr(CASE %(part)s::text WHEN 'head' THEN head WHEN 'tail' THEN tail END,
              %(start)s, %(chars)s) AS part,
       length(CASE %(part)s::text WHEN 'head' THEN head WHEN 'tail' THEN tail END) AS chars,
       omitted_bytes
  FROM @schema@.job_logs
 WHERE job_id = %(id)s AND lease_token = %(token)s;

-- name: job_explain_facts
-- What `explain` reasons from, for job %(id)s, in one round trip (NULL job: no such
-- job). daemons: the registry's daemons not gone that serve its handler or its queue
-- (at most 100), each with whether it is fresh (not silent), what of the job it serves, its drain state, busy slots and its settings of
-- the handler. paused: the pauses of its queue and handler. The current leases of its
-- handler and of its concurrency key (counts, and the first 20 ids). The live job holding
-- its dedupe key, if another. How many due jobs of its handler come before it in claim
-- order (counted up to 10,000). Its latest recorded attempt and how many are recorded.
-- The registry row of the daemon holding it. "Fresh" and "silent" are daemon_silent
-- (0021), the one definition every surface uses.
WITH job AS (
    SELECT j.*, to_jsonb(j) - 'payload' - 'result' - 'checkpoint' AS row_json
      FROM @schema@.jobs j WHERE j.id = %(id)s
)
SELECT j.row_json AS job,
       (SELECT coalesce(jsonb_agg(d ORDER BY d.id), '[]') FROM (
            SELECT w.id, w.host, w.pid, w.state, w.drain_requested, w.slots,
                   cardinality(w.in_flight) AS busy,
                   extract(epoch FROM now() - w.heartbeat_at)::float8 AS heartbeat_age_seconds,
                   NOT @schema@.daemon_silent(w) AS fresh,
                   extract(epoch FROM w.heartbeat_interval)::float8
                       AS heartbeat_interval_seconds,
                   j.handler = ANY(w.handlers) AS serves_handler,
                   j.queue = ANY(w.queues) AS serves_queue,
                   CASE WHEN jsonb_typeof(w.handler_settings) = 'object'
                        THEN w.handler_settings -> j.handler END AS settings,
                   (SELECT count(*) FROM @schema@.jobs r
                     WHERE r.status = 'running' AND r.handler = j.handler
                       AND r.locked_by = w.id) AS busy_with_handler
              FROM @schema@.workers w
             WHERE w.state <> 'gone' AND (j.handler = ANY(w.handlers) OR j.queue = ANY(w.queues))
             ORDER BY w.id
             LIMIT 100) d) AS daemons,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'kind', p.kind, 'name', p.name, 'paused_at', p.paused_at,
                   'paused_by', p.paused_by, 'comment', p.comment) ORDER BY p.kind), '[]')
          FROM @schema@.paused p
         WHERE (p.kind = 'queue' AND p.name = j.queue)
            OR (p.kind = 'handler' AND p.name = j.handler)) AS paused,
       (SELECT count(*) FROM @schema@.jobs r
         WHERE r.status = 'running' AND r.handler = j.handler AND r.locked_until > now())
           AS handler_running,
       ARRAY(SELECT r.id FROM @schema@.jobs r
              WHERE r.status = 'running' AND r.handler = j.handler AND r.locked_until > now()
              ORDER BY r.id LIMIT 20) AS handler_running_ids,
       (SELECT count(*) FROM @schema@.jobs r
         WHERE r.status = 'running' AND r.handler = j.handler
           AND r.concurrency_key = j.concurrency_key AND r.locked_until > now())
           AS key_running,
       ARRAY(SELECT r.id FROM @schema@.jobs r
              WHERE r.status = 'running' AND r.handler = j.handler
                AND r.concurrency_key = j.concurrency_key AND r.locked_until > now()
              ORDER BY r.id LIMIT 20) AS key_running_ids,
       (SELECT r.id FROM @schema@.jobs r
         WHERE j.dedupe_key IS NOT NULL AND r.handler = j.handler
           AND r.dedupe_key = j.dedupe_key AND r.status IN ('pending', 'running')
           AND r.id <> j.id
         LIMIT 1) AS dedupe_holder,
       (SELECT count(*) FROM (
            SELECT 1 FROM @schema@.jobs a
             WHERE a.status = 'pending' AND a.handler = j.handler AND a.run_at <= now()
               AND (a.priority, a.run_at, a.id) < (j.priority, j.run_at, j.id)
             LIMIT 10000) ahead) AS due_ahead,
       (SELECT jsonb_build_object('attempt', a.attempt, 'outcome', a.outcome,
                                  'worker', a.worker, 'host', a.host,
                                  'finished_at', a.finished_at, 'error', a.error)
          FROM @schema@.attempts a WHERE a.job_id = j.id
         ORDER BY a.finished_at DESC, a.lease_token DESC LIMIT 1) AS last_attempt,
       (SELECT count(*) FROM @schema@.attempts a WHERE a.job_id = j.id) AS attempts_recorded,
       (SELECT jsonb_build_object('id', w.id, 'host', w.host, 'pid', w.pid, 'state', w.state,
                                  'heartbeat_age_seconds',
                                  extract(epoch FROM now() - w.heartbeat_at)::float8,
                                  'heartbeat_interval_seconds',
                                  extract(epoch FROM w.heartbeat_interval)::float8,
                                  'silent', @schema@.daemon_silent(w))
          FROM @schema@.workers w WHERE w.id = j.locked_by) AS holder,
       CASE WHEN isfinite(j.run_at) THEN extract(epoch FROM j.run_at - now())::float8
       END AS run_in_seconds,
       extract(epoch FROM j.locked_until - now())::float8 AS lease_left_seconds,
       now() AS now
  FROM (SELECT 1) AS one LEFT JOIN job j ON true;

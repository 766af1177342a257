-- Statements on jobs: enqueue, the claim, the fenced writes of a claimed job (renew and
-- every finish, through the functions of sql/objects/finish.sql), an operator's cancel,
-- retry and prune, and the reads of jobs.
--
-- Durable whatever the server's default: the claim (claim_jobs, which every language
-- uses) and the daemon's other fenced writes (renew and every finish, the functions of
-- migrations 0019, 0022 and 0025 since the daemon role lost UPDATE on jobs) each run
-- `set_config('synchronous_commit', 'on', true)`, the per-transaction form of SET LOCAL
-- (no extra round trip, and safe behind PgBouncer in transaction mode). Its setting holds
-- until the commit of the (implicit) transaction, also when set inside a function (whose
-- SET clause pins only search_path): an acknowledged claim or finish is on disk (and,
-- with synchronous_standby_names, on the standby) even where synchronous_commit = off.
--
-- Each statement under a "-- name:" header with a one-line description; queue/queries.py
-- loads every file of this folder into one registry (a name is defined once, in the file
-- of its entity: docs/development/sql.md). @schema@ is replaced by the quoted schema
-- name, @schema_literal@ by it as a string literal and @notify_channel@ (and the other
-- @..._channel@) by the quoted name of a channel; parameters are psycopg's %(name)s
-- placeholders (so a literal percent sign is written %%).

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

-- name: job_enqueue_many_v3
-- job_enqueue_many whose job objects may carry dependencies and deadlines ("after",
-- "after_index", "on_parent_failure", "expires_at"/"expire_in", "timeout": schema 27;
-- used only when one of the jobs has one).
SELECT @schema@.enqueue_many_v3(%(jobs)s::jsonb) AS ids;

-- name: job_held_release
-- An operator releases a job held after a parent failed (on_parent_failure hold): it
-- runs once its parents have all finished. Returns its status after.
SELECT @schema@.job_held_release(%(id)s::bigint) AS status;

-- name: job_claim
-- Claim up to %(limit)s due jobs for one worker, rescuing expired leases on the way, with
-- claim_jobs_v3 (schema 31): claim_v3's one statement (JIT off, its plan kept per session,
-- fleet-wide limits and pauses) behind checked arguments and a durable commit of its own;
-- expired jobs end instead of starting. %(handlers)s is a JSON array with one object per
-- handler: its lease, free slots, max_attempts, queues (null: all) and limits (null:
-- none). Each job comes with its own timeout, its parents' results, what woke it (it
-- waited: WaitFor), for a batch's callback its batch, and its enqueuer's trace context
-- (schema 39; the child's span links to it only while [tracing] is enabled): no other
-- read after a claim.
-- The columns are named as ClaimedJob's fields (queue/records.py; a test holds every
-- record to its statement's columns by name).
SELECT c.id, c.queue, c.handler, c.payload, c.priority, c.attempts AS attempt,
       c.max_attempts, c.lease_token AS token, c.checkpoint, c.run_at, c.created_at,
       c.locked_until, c.rescued, c.timeout_seconds, c.parents, c.has_children,
       c.wait_for, c.wait_ended, c.signal_payload, c.signal_sent_at, c.batch,
       c.trace_context AS trace
  FROM @schema@.claim_jobs_v3(
    worker => %(worker)s::text, queues => %(queues)s::text[], max_jobs => %(limit)s::integer,
    handlers => %(handlers)s::jsonb) AS c;

-- name: job_renew
-- Renew many leases of one worker at once, saving progress and checkpoints sent along
-- (NULL keeps the old value); one row per lease: renewed or lost, and cancel requests.
-- Through renew_leases (migration 0022: fenced by the lease, SECURITY DEFINER, the
-- daemon role has no UPDATE on jobs). Like every function that ends or changes a held
-- job, it forces a durable commit (synchronous_commit on for the transaction).
SELECT r.id, r.renewed, r.cancel_requested
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
-- job_complete for one job (tests and benchmarks; the daemon batches): complete_jobs
-- (migration 0025, the one text of a completion; durable) with one-element arrays, called
-- directly: through complete_job, its wrapper for other languages, it would pay a second
-- SECURITY DEFINER call (~8 us, migration 0025). Returns the id if the lease held.
SELECT c.id
  FROM @schema@.complete_jobs(%(worker)s::text, ARRAY[%(id)s::bigint], ARRAY[%(token)s::bigint],
                              ARRAY[%(result)s::jsonb], ARRAY[%(progress)s::jsonb]) AS c(id);

-- name: job_complete_with_follow_ups
-- job_complete for a batch of which some jobs return follow-up jobs (schema 29): each
-- completion and its follow-ups (%(follow_ups)s: one JSON array or NULL per job) in one
-- transaction, through jobs_complete_with_follow_ups (durable). A row per job completed
-- (follow_up_ids) or left running because its follow-ups were refused (refused: why); a
-- missing id lost its lease. Batches without follow-ups keep to job_complete.
SELECT c.id, c.follow_up_ids, c.refused
  FROM @schema@.jobs_complete_with_follow_ups(
           %(worker)s::text, %(ids)s::bigint[], %(tokens)s::bigint[], %(results)s::jsonb[],
           %(progress)s::jsonb[], %(follow_ups)s::jsonb[]) AS c;

-- name: job_fail
-- A failed attempt, through fail_job (migration 0025, the text every language uses): back
-- to pending after exponential backoff with +-25 %% jitter, or dead once max_attempts are
-- used, or cancelled if a cancel was requested meanwhile. The attempt's latest progress
-- and checkpoint are saved with it (NULL keeps the old value), so the next attempt resumes
-- from there. retry_in: seconds until the retry (pending only). Durable.
SELECT f.status, f.run_at, f.retry_in
  FROM @schema@.fail_job(%(id)s::bigint, %(worker)s::text, %(token)s::bigint,
                         %(error)s::text, %(backoff_base)s::float8, %(backoff_max)s::float8,
                         %(progress)s::jsonb, %(checkpoint)s::jsonb) AS f;

-- name: job_release
-- Hand a job back (drain, hand-back, shutdown), through release_job (migration 0025, the
-- text every language uses): pending at once, the attempt not counted, and in its old
-- place in the queue (run_at kept), so the next daemon takes it before newer jobs. Its
-- latest progress and checkpoint are saved (NULL keeps the old value). The function
-- wakes the peers that serve it on commit, as for a new job. Durable. No row: the lease
-- was lost.
SELECT r.status
  FROM @schema@.release_job(%(id)s::bigint, %(worker)s::text, %(token)s::bigint,
                            %(progress)s::jsonb, %(checkpoint)s::jsonb) AS r(status)
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
-- Cancel jobs by id: pending ones (and waiting ones: schema 27) at once, running ones by
-- request to their daemon (suspended ones, waiting for a signal, at once too: 0028).
WITH target AS (
    SELECT id FROM @schema@.jobs WHERE id = ANY(%(ids)s::bigint[]) FOR UPDATE
), cancelled AS (
    UPDATE @schema@.jobs j
       SET status = CASE WHEN j.status IN ('pending', 'waiting', 'suspended') THEN 'cancelled'
                         ELSE j.status END,
           finished_at = CASE WHEN j.status IN ('pending', 'waiting', 'suspended') THEN now()
                              ELSE j.finished_at END,
           cancel_requested = (j.status = 'running'),
           updated_at = now()
      FROM target t
     WHERE j.id = t.id AND j.status IN ('pending', 'waiting', 'suspended', 'running')
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
-- queue or handler (NULL filters match everything, but at least one is given). A job
-- with parents not finished yet goes back to waiting for them (schema 27).
UPDATE @schema@.jobs j
   SET status = CASE WHEN j.parents_unfinished > 0 THEN 'waiting'
                     ELSE 'pending' END::@schema@.job_status,
       attempts = 0, snoozes = 0, run_at = now(), finished_at = NULL,
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
                       AND live.id <> j.id
                       -- the key's holder (jobs_dedupe_live_idx's predicate, 0034)
                       AND (live.status IN ('pending', 'waiting', 'suspended', 'running')
                            OR live.dedupe_window_seconds IS NOT NULL))
        AND j.id = (SELECT max(d.id) FROM @schema@.jobs d
                     WHERE d.handler = j.handler AND d.dedupe_key = j.dedupe_key
                       AND d.status IN ('dead', 'cancelled')
                       AND (%(ids)s::bigint[] IS NULL OR d.id = ANY(%(ids)s::bigint[]))
                       AND (%(queue)s::text IS NULL OR d.queue = %(queue)s)
                       AND (%(handler)s::text IS NULL OR d.handler = %(handler)s))))
RETURNING j.id;

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
-- Who holds a job, and whether under token %(token)s (token: that token, else NULL):
-- what a rejected outcome is checked against (never the payload or other values that a
-- poison row may hold). Through job_lease_state_v1 (schema 24): the daemon role reads no
-- lease token.
SELECT status, CASE WHEN token_holds THEN %(token)s::bigint END AS token, locked_by
  FROM @schema@.job_lease_state_v1(%(id)s::bigint, %(token)s::bigint);

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
-- when there is none), the running job whose lease ends first (NULLs: none), and the
-- seconds until the next start-rate token of its handlers (NULL: none due later). One row; measured by the server's clock, so no second round trip to
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
       extract(epoch FROM r.locked_until - now())::float8 AS expires_in,
       -- and the next start-rate token of these handlers or their keys (claim_v4, schema
       -- 33): jobs held back by a rate become claimable then, so the daemons wake for it
       -- (rate_buckets_next_at_idx; its rows are the starts of the last 1/rate, so at most
       -- one wake per start, never a poll)
       (SELECT extract(epoch FROM min(b.next_at) - now())::float8 FROM @schema@.rate_buckets b
         WHERE b.handler = ANY(%(handlers)s::text[]) AND b.next_at > now()) AS token_in
  FROM (SELECT 1) AS one
  LEFT JOIN LATERAL (
      SELECT j.id, j.queue, j.handler, j.locked_by, j.locked_until FROM @schema@.jobs j
       WHERE j.status = 'running' AND j.locked_until IS NOT NULL
         AND j.handler = ANY(%(handlers)s::text[]) AND j.queue = ANY(%(queues)s::text[])
       ORDER BY j.locked_until
       LIMIT 1) r ON true;

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

-- name: job_snooze
-- The handler asked to run again in %(delay)s seconds (pgworkerd.Snooze), which is not a
-- failure, through snooze_held_job (migration 0025, the text snooze_job uses too;
-- durable): pending again at now() + delay with the attempt not counted and one more
-- snooze counted (cancelled instead if a cancel was requested meanwhile), its latest
-- progress and checkpoint saved (NULL keeps the old value), last_error kept. Only while
-- the job has snoozed fewer than %(max_snoozes)s times: no row back then, and the attempt
-- is recorded as failed instead (queue.finish; a lost lease also gives no row: job_fail,
-- under the same fence, changes nothing either). retry_in: seconds until it is due.
SELECT s.status, s.run_at, s.snoozes, s.retry_in
  FROM @schema@.snooze_held_job(%(id)s::bigint, %(worker)s::text, %(token)s::bigint,
                                %(delay)s::float8, %(max_snoozes)s::integer,
                                %(progress)s::jsonb, %(checkpoint)s::jsonb) AS s;

-- name: job_info
-- One job as pgworkerd.get returns it (client.JobInfo's fields, in order), through the
-- function of migration 0018: every job for a role that may read the jobs table, only its
-- own for an enqueuer (no row otherwise, as for an unknown id).
SELECT * FROM @schema@.job_get_v1(%(id)s);

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
                   'paused_by', p.paused_by, 'comment', p.comment,
                   'requested_by', p.requested_by) ORDER BY p.kind), '[]')
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
           AND r.dedupe_key = j.dedupe_key
           AND (r.status IN ('pending', 'waiting', 'suspended', 'running')
                OR r.dedupe_window_seconds IS NOT NULL)
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
         ORDER BY a.finished_at DESC, a.attempt DESC, a.lease_token DESC LIMIT 1) AS last_attempt,
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

-- name: job_suspend
-- The handler raised pgworkerd.WaitFor: suspended until signal %(name)s or
-- %(timeout)s seconds, the attempt not counted (job_suspend in finish.sql, migration
-- 0028; durable); pending at once when the job already has that signal. status
-- 'refused' with problem: the correlation key is another live job's (nothing changed).
-- No row: the lease was lost.
SELECT s.status, s.wait_until, s.problem
  FROM @schema@.job_suspend(%(id)s::bigint, %(worker)s::text, %(token)s::bigint,
                            %(name)s::text, %(timeout)s::float8, %(key)s::text,
                            %(progress)s::jsonb, %(checkpoint)s::jsonb) AS s;

-- name: job_waits_expire
-- Suspended jobs past their timeout become pending (at most %(max_jobs)s; job_waits_expire
-- in signals.sql): the daemons' timeout sweep. Returns how many.
SELECT @schema@.job_waits_expire(%(max_jobs)s::integer) AS moved;

-- name: job_expired_cancel
-- The expiry sweep (job_expired_cancel in retention.sql, 0032): jobs past their expires_at
-- end as cancelled, at most %(max_jobs)s pending and as many running. Returns how many.
SELECT @schema@.job_expired_cancel(%(max_jobs)s::integer) AS ended;
-- name: job_run_now
-- Pending jobs due later (scheduled, or waiting for a retry's backoff) due now instead
-- (the dashboard's "run now"); returns the ids moved. The caller bounds the selection.
UPDATE @schema@.jobs
   SET run_at = now(), updated_at = now()
 WHERE id = ANY(%(ids)s::bigint[]) AND status = 'pending' AND run_at > now()
RETURNING id;

-- name: job_delete_finished
-- Delete finished jobs (completed, dead, cancelled) by id (the dashboard's "delete"; their
-- attempts and logs go with them through the triggers); returns the ids deleted. A live
-- job is cancelled first, never deleted under its daemon. The caller bounds the selection.
-- What retention keeps stays (prune_finished_v2's rule): a parent while a child has not
-- finished (it reads the parent's result when it starts), a batch member while its
-- callback has not (it reads the members' outcomes).
DELETE FROM @schema@.jobs
 WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('completed', 'dead', 'cancelled')
   AND NOT (has_children AND @schema@.job_children_unfinished(id))
   AND NOT (batch_id IS NOT NULL AND @schema@.batch_callback_unfinished(batch_id))
RETURNING id;

-- name: job_priority_set
-- The priority of a selection of live jobs, through job_priority_set (0036): one row per
-- id asked, with its outcome.
SELECT id, outcome FROM @schema@.job_priority_set(%(ids)s::bigint[], %(priority)s::integer);

-- name: job_dead_ids
-- The ids of at most %(limit)s dead jobs of a queue or a handler (NULL: any), newest
-- first, through the (queue, status, id) or (handler, status, id) index: the dashboard's
-- "retry all dead of this handler/queue", one bounded action.
SELECT id FROM @schema@.jobs
 WHERE status = 'dead'
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(handler)s::text IS NULL OR handler = %(handler)s)
 ORDER BY id DESC
 LIMIT %(limit)s;

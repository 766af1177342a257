-- The read side: what `status`, `show`, `jobs`, `explain` and the dashboard read
-- (queue/views.py).
--
-- Each statement under a "-- name:" header with a one-line description; queue/queries.py
-- loads every file of this folder into one registry (a name is defined once, in the file
-- of its entity: docs/development/sql.md). @schema@ is replaced by the quoted schema
-- name, @schema_literal@ by it as a string literal and @notify_channel@ (and the other
-- @..._channel@) by the quoted name of a channel; parameters are psycopg's %(name)s
-- placeholders (so a literal percent sign is written %%).

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
    -- (through jobs_suspended_until_idx, which holds suspended jobs only: 0028)
    SELECT queue, 'suspended', count(*)
      FROM @schema@.jobs WHERE status = 'suspended' GROUP BY queue
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
       -- a part of the pending jobs (the dashboard's tabs; NULL: no such filter)
       AND (%(pending_when)s::text IS NULL OR (j.status::text = 'pending' AND CASE %(pending_when)s::text
                WHEN 'due' THEN j.run_at <= now()
                WHEN 'scheduled' THEN j.run_at > now() AND j.attempts = 0
                ELSE j.run_at > now() AND j.attempts > 0 END))
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
UNION ALL (SELECT * FROM page WHERE status = 'suspended'
                  AND 'suspended' = ANY(%(statuses)s::text[])
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
UNION ALL (SELECT * FROM page WHERE status = 'waiting'  -- schema 27: parents
                  AND 'waiting' = ANY(%(statuses)s::text[])
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
       -- a part of the pending jobs (the dashboard's tabs; NULL: no such filter)
       AND (%(pending_when)s::text IS NULL OR (j.status::text = 'pending' AND CASE %(pending_when)s::text
                WHEN 'due' THEN j.run_at <= now()
                WHEN 'scheduled' THEN j.run_at > now() AND j.attempts = 0
                ELSE j.run_at > now() AND j.attempts > 0 END))
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
UNION ALL (SELECT * FROM page WHERE status = 'suspended'
                  AND 'suspended' = ANY(%(statuses)s::text[])
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
UNION ALL (SELECT * FROM page WHERE status = 'waiting'  -- schema 27: parents
                  AND 'waiting' = ANY(%(statuses)s::text[])
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
   -- a part of the pending jobs (the dashboard's tabs; NULL: no such filter)
   AND (%(pending_when)s::text IS NULL OR (j.status::text = 'pending' AND CASE %(pending_when)s::text
            WHEN 'due' THEN j.run_at <= now()
            WHEN 'scheduled' THEN j.run_at > now() AND j.attempts = 0
            ELSE j.run_at > now() AND j.attempts > 0 END))
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
   -- a part of the pending jobs (the dashboard's tabs; NULL: no such filter)
   AND (%(pending_when)s::text IS NULL OR (j.status::text = 'pending' AND CASE %(pending_when)s::text
            WHEN 'due' THEN j.run_at <= now()
            WHEN 'scheduled' THEN j.run_at > now() AND j.attempts = 0
            ELSE j.run_at > now() AND j.attempts > 0 END))
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
                THEN (s.value ->> 'max_running_per_key')::numeric END AS per_key,
           -- schema 33: fair share, and start rates as written ("20/m", at most 32 chars)
           jsonb_typeof(s.value -> 'fair') = 'boolean' AND (s.value ->> 'fair')::boolean
               AS fair,
           CASE WHEN jsonb_typeof(s.value -> 'rate') = 'string'
                THEN left(s.value ->> 'rate', 32) END AS rate,
           CASE WHEN jsonb_typeof(s.value -> 'rate_per_key') = 'string'
                THEN left(s.value ->> 'rate_per_key', 32) END AS rate_per_key
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
                 LIMIT 20) k) AS busiest_keys,
       -- schema 33: whether any daemon serves it fair, the rates daemons declare (each
       -- applies its own: they should agree), the handler's next start-rate token (NULL:
       -- one is due now), and whether it is paused
       coalesce(bool_or(d.fair), false) AS fair,
       array_remove(array_agg(DISTINCT d.rate), NULL) AS rates,
       array_remove(array_agg(DISTINCT d.rate_per_key), NULL) AS rates_per_key,
       (SELECT b.next_at FROM @schema@.rate_buckets b
         WHERE b.handler = d.handler AND b.concurrency_key = '' AND b.next_at > now())
           AS next_token_at,
       EXISTS (SELECT 1 FROM @schema@.paused p WHERE p.kind = 'handler' AND p.name = d.handler)
           AS paused
  FROM declared d
 WHERE d.max_running IS NOT NULL OR d.per_key IS NOT NULL
    OR d.fair OR d.rate IS NOT NULL OR d.rate_per_key IS NOT NULL
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
       left(j.last_error, %(shown)s) AS last_error, length(j.last_error) AS last_error_chars,
       -- its wait (durable waits, 0028): names are bounded at 128 characters
       j.wait_for, j.wait_since, j.wait_until, j.wait_key, j.wait_ended,
       -- held for an operator (dependencies, 0027): the page's Release button
       j.on_parent_failure, j.parents_failed
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
     ORDER BY finished_at DESC, attempt DESC, lease_token DESC
     LIMIT %(limit)s) a
 ORDER BY a.finished_at, a.attempt, a.lease_token;

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
     ORDER BY attempt DESC, updated_at DESC, lease_token DESC  -- as job_log_list
     LIMIT %(limit)s) l
 ORDER BY l.attempt, l.updated_at, l.lease_token;

-- name: view_job_log_part
-- %(chars)s characters from character %(start)s (1-based) of one attempt's head or tail
-- (%(part)s: head or tail), and its whole length: the raw download of a job's log.
SELECT substr(CASE %(part)s::text WHEN 'head' THEN head WHEN 'tail' THEN tail END,
              %(start)s, %(chars)s) AS part,
       length(CASE %(part)s::text WHEN 'head' THEN head WHEN 'tail' THEN tail END) AS chars,
       omitted_bytes
  FROM @schema@.job_logs
 WHERE job_id = %(id)s AND lease_token = %(token)s;

-- name: view_job_relatives
-- A job's parents and children (schema 27) for show, explain and the dashboard: each
-- with its status and handler (NULL status: a parent pruned since), parents first, each
-- side in id order and at most %(limit)s long; `total` counts its side whole.
(SELECT 'parent' AS side, p.parent_id AS id, j.status::text AS status, j.handler,
        count(*) OVER () AS total
   FROM @schema@.job_parents p
   LEFT JOIN @schema@.jobs j ON j.id = p.parent_id
  WHERE p.child_id = %(id)s
  ORDER BY p.parent_id
  LIMIT %(limit)s)
UNION ALL
(SELECT 'child', c.child_id, j.status::text, j.handler, count(*) OVER ()
   FROM @schema@.job_parents c
   LEFT JOIN @schema@.jobs j ON j.id = c.child_id
  WHERE c.parent_id = %(id)s
  ORDER BY c.child_id
  LIMIT %(limit)s);

-- name: view_job_follow_ups
-- The follow-ups job %(id)s's completion inserted (relation 'then', in the handler's
-- order) and the jobs whose completion inserted it ('of'; more than one only through a
-- dedupe key), each with its status (NULL: pruned since). Schema 29: `show`, `explain`
-- and the dashboard's job page. At most 1000 of each (a completion inserts at most 1000).
(SELECT 'then' AS relation, f.position, f.follow_up_id AS id, j.status::text AS status
   FROM @schema@.job_follow_ups f LEFT JOIN @schema@.jobs j ON j.id = f.follow_up_id
  WHERE f.job_id = %(id)s
  ORDER BY f.position
  LIMIT 1000)
UNION ALL
(SELECT 'of', f.position, f.job_id, j.status::text
   FROM @schema@.job_follow_ups f LEFT JOIN @schema@.jobs j ON j.id = f.job_id
  WHERE f.follow_up_id = %(id)s
  ORDER BY f.job_id
  LIMIT 1000);

-- name: view_rate_tokens
-- The start-rate tokens (claim_v4, schema 33) not yet due that hold a job back: its
-- handler's (concurrency_key '') and its key's, with when each is due (explain).
SELECT b.concurrency_key, b.next_at, extract(epoch FROM b.next_at - now())::float8 AS in_seconds
  FROM @schema@.rate_buckets b
 WHERE b.handler = %(handler)s::text
   AND b.concurrency_key IN ('', coalesce(%(key)s::text, ''))
   AND b.next_at > now()
 ORDER BY b.concurrency_key;

-- name: view_fair_cursor
-- The key a fair handler's round robin served last (claim_v4, schema 33; none: no row).
SELECT c.concurrency_key, c.used FROM @schema@.fair_cursors c WHERE c.handler = %(handler)s::text;

-- name: view_fair_next_key
-- The next key (in jobs_pending_fair_idx's order; '' for jobs without one) after
-- %(after)s (NULL: the first) with pending jobs of a handler at a priority: one index
-- probe, the step of claim_v4's round robin (explain walks a few of them).
SELECT coalesce(j.concurrency_key, '') AS concurrency_key
  FROM @schema@.jobs j
 WHERE j.status = 'pending' AND j.handler = %(handler)s::text
   AND j.priority = %(priority)s::integer
   AND (%(after)s::text IS NULL OR coalesce(j.concurrency_key, '') > %(after)s::text)
 ORDER BY coalesce(j.concurrency_key, '')
 LIMIT 1;
-- name: view_job_tab_counts
-- The jobs list's tabs: how many jobs each holds (of %(queue)s and %(handler)s, NULL:
-- any), each count stopping at %(cap)s (the page shows "10000+"), so a tab of 10 M
-- completed jobs costs %(cap)s index entries, not the table. Due, scheduled and retrying
-- split the pending jobs: due now; due later, never run; due later after an attempt (a
-- retry's backoff). Each status a constant, so each count has its index (jobs_status_id_idx,
-- or by queue or handler); run unprepared: a filter not given folds away.
WITH scoped AS NOT MATERIALIZED (
    SELECT j.status, j.run_at, j.attempts FROM @schema@.jobs j
     WHERE (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
       AND (%(handler)s::text IS NULL OR j.handler = %(handler)s::text)
)
SELECT t.tab, t.jobs FROM (VALUES
    (1, 'due', (SELECT count(*) FROM (SELECT 1 FROM scoped WHERE status = 'pending'
                   AND run_at <= now() LIMIT %(cap)s) c)),
    (2, 'scheduled', (SELECT count(*) FROM (SELECT 1 FROM scoped WHERE status = 'pending'
                   AND run_at > now() AND attempts = 0 LIMIT %(cap)s) c)),
    (3, 'retrying', (SELECT count(*) FROM (SELECT 1 FROM scoped WHERE status = 'pending'
                   AND run_at > now() AND attempts > 0 LIMIT %(cap)s) c)),
    (4, 'running', (SELECT count(*) FROM (SELECT 1 FROM scoped WHERE status = 'running'
                   LIMIT %(cap)s) c)),
    (5, 'waiting', (SELECT count(*) FROM (SELECT 1 FROM scoped WHERE status = 'waiting'
                   LIMIT %(cap)s) c)),
    (6, 'suspended', (SELECT count(*) FROM (SELECT 1 FROM scoped WHERE status = 'suspended'
                   LIMIT %(cap)s) c)),
    (7, 'dead', (SELECT count(*) FROM (SELECT 1 FROM scoped WHERE status = 'dead'
                   LIMIT %(cap)s) c)),
    (8, 'cancelled', (SELECT count(*) FROM (SELECT 1 FROM scoped WHERE status = 'cancelled'
                   LIMIT %(cap)s) c)),
    (9, 'completed', (SELECT count(*) FROM (SELECT 1 FROM scoped WHERE status = 'completed'
                   LIMIT %(cap)s) c))
) AS t(n, tab, jobs)
 ORDER BY t.n;

-- name: view_limits_held
-- What each limit holds back (the Limits page): per handler of %(handlers)s (with its
-- strictest per-key limit in %(per_key)s, NULL: none), its due pending jobs, and those of
-- them whose concurrency key already runs its per-key limit of jobs. Each count stops at
-- %(cap)s (the pending index by handler; a key's running jobs through
-- jobs_running_handler_key_idx).
SELECT h.handler,
       (SELECT count(*) FROM (
            SELECT 1 FROM @schema@.jobs j
             WHERE j.status = 'pending' AND j.handler = h.handler AND j.run_at <= now()
             LIMIT %(cap)s) c) AS due,
       CASE WHEN h.per_key IS NULL THEN 0 ELSE (SELECT count(*) FROM (
            SELECT 1 FROM @schema@.jobs j
             WHERE j.status = 'pending' AND j.handler = h.handler AND j.run_at <= now()
               AND j.concurrency_key IS NOT NULL
               AND (SELECT count(*) FROM @schema@.jobs r
                     WHERE r.status = 'running' AND r.handler = h.handler
                       AND r.concurrency_key = j.concurrency_key
                       AND r.locked_until > now()) >= h.per_key
             LIMIT %(cap)s) c) END AS held_by_key
  FROM unnest(%(handlers)s::text[], %(per_key)s::bigint[]) AS h(handler, per_key);

-- name: view_attempt_rollups
-- The charts' rows (0038): the rollup's buckets of grain %(grain)s s from %(since)s on, per
-- handler, oldest first. A range of the primary key: at most (window / grain) x handlers
-- rows, whatever the number of jobs.
SELECT r.bucket_start, r.handler, r.completed, r.failed, r.run_counts, r.wait_counts
  FROM @schema@.attempt_rollups r
 WHERE r.grain_seconds = %(grain)s::integer AND r.bucket_start >= %(since)s::timestamptz
 ORDER BY r.bucket_start, r.handler;

-- name: view_attempt_rollup_cursor
-- How far the charts' rollup has counted (0038): attempts that ended before it are in the
-- charts; with the database's now and the histograms' bounds.
SELECT c.rolled_to, now() AS now, @schema@.attempt_rollup_bounds() AS bounds
  FROM @schema@.attempt_rollup_cursor c;

-- Statements on the captured output of jobs' attempts (sql/objects/job_logs.sql).
--
-- Each statement under a "-- name:" header with a one-line description; queue/queries.py
-- loads every file of this folder into one registry (a name is defined once, in the file
-- of its entity: docs/development/sql.md). @schema@ is replaced by the quoted schema
-- name, @schema_literal@ by it as a string literal and @notify_channel@ (and the other
-- @..._channel@) by the quoted name of a channel; parameters are psycopg's %(name)s
-- placeholders (so a literal percent sign is written %%).

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
 -- by attempt number (it never goes down; it recurs after a release, then by time): one
 -- write stores every attempt's output with the same updated_at, and tokens are random
 ORDER BY attempt, updated_at, lease_token;

-- name: job_log_state
-- Whether a job exists, and the attempt it runs now (for `logs --follow`).
SELECT status::text AS status, attempts, lease_token
  FROM @schema@.jobs WHERE id = %(id)s;

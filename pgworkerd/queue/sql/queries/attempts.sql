-- Statements on the attempt history (sql/objects/attempts.sql).
--
-- Each statement under a "-- name:" header with a one-line description; queue/queries.py
-- loads every file of this folder into one registry (a name is defined once, in the file
-- of its entity: docs/development/sql.md). @schema@ is replaced by the quoted schema
-- name, @schema_literal@ by it as a string literal and @notify_channel@ (and the other
-- @..._channel@) by the quoted name of a channel; parameters are psycopg's %(name)s
-- placeholders (so a literal percent sign is written %%).

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
 ORDER BY finished_at, attempt, lease_token;

-- name: attempt_memory_peaks
-- Memory admission (daemon/admission.py): per handler of %(handlers)s, the
-- %(percentile)s percentile of the measured peak memory (bytes) of the attempts of its
-- newest %(jobs)s completed and %(jobs)s dead jobs (at most %(last)s attempts, newest
-- first), and how many attempts that is. Bounded whatever the history's size: each
-- handler's newest jobs through jobs_handler_status_id_idx, their attempts by primary key.
SELECT h.handler, m.peak, m.attempts
  FROM unnest(%(handlers)s::text[]) AS h(handler)
  CROSS JOIN LATERAL (
      SELECT percentile_disc(%(percentile)s::float8) WITHIN GROUP (ORDER BY r.peak_memory)
                 AS peak,
             count(*) AS attempts
        FROM (SELECT a.peak_memory
                FROM (SELECT * FROM (SELECT j.id FROM @schema@.jobs j
                                      WHERE j.handler = h.handler AND j.status = 'completed'
                                      ORDER BY j.id DESC LIMIT %(jobs)s) c
                      UNION ALL
                      SELECT * FROM (SELECT j.id FROM @schema@.jobs j
                                      WHERE j.handler = h.handler AND j.status = 'dead'
                                      ORDER BY j.id DESC LIMIT %(jobs)s) d) recent
                JOIN @schema@.attempts a ON a.job_id = recent.id
               WHERE a.peak_memory IS NOT NULL
               ORDER BY a.finished_at DESC
               LIMIT %(last)s) r) m;

-- name: attempt_rollups_advance
-- One step of the charts' rollup (attempt_rollups_advance in objects/attempts.sql, 0038):
-- counts at most about %(max_attempts)s ended attempts past the cursor, none that ended
-- within %(lag_seconds)s s. No row: another daemon is rolling up.
SELECT r.rolled_to, r.behind
  FROM @schema@.attempt_rollups_advance(%(max_attempts)s::integer, %(lag_seconds)s::float8) r;

-- Least-privilege roles for pgworkerd. Run after `pgworkerd migrate`, as a role with
-- CREATEROLE (CREATE ROLE needs it; a superuser will do), which must also be able to grant
-- on the schema's objects: the schema owner, or a superuser.
--   pgworkerd_daemon:   what `pgworkerd run`, drain, resume, status and jobs need.
--   pgworkerd_enqueuer: only enqueue (the SQL functions); it cannot read or change jobs.
-- Replace the passwords (or use another authentication method) and the schema name if you
-- changed it. The enqueue functions are SECURITY DEFINER, so enqueuers need no rights
-- on the table itself.
--
-- Dedupe keys are scoped per handler: a key names one live job of its handler, so an
-- enqueuer cannot block another application's job by squatting its key under another
-- handler. Every enqueuer can still use (and so learn about) keys of any handler it names:
-- give applications that must not see each other their own schema (`--schema`).

CREATE ROLE pgworkerd_daemon LOGIN PASSWORD 'change-me';
CREATE ROLE pgworkerd_enqueuer LOGIN PASSWORD 'change-me';

GRANT USAGE ON SCHEMA pgworkerd TO pgworkerd_daemon, pgworkerd_enqueuer;

GRANT SELECT ON pgworkerd.schema_version TO pgworkerd_daemon;
-- UPDATE only on the columns the daemon writes (claim(), the statements in queries.sql):
-- never payload, handler, queue, priority or dedupe_key, so a compromised worker host
-- cannot rewrite what other hosts' handlers will run.
GRANT SELECT ON pgworkerd.jobs TO pgworkerd_daemon;
GRANT UPDATE (status, locked_by, locked_until, lease_token, attempts, max_attempts,
              last_error, result, progress, checkpoint, cancel_requested, run_at,
              started_at, finished_at, updated_at)
      ON pgworkerd.jobs TO pgworkerd_daemon;
-- snoozes: counted by the daemon when a handler snoozes a job (schema 9)
GRANT UPDATE (snoozes) ON pgworkerd.jobs TO pgworkerd_daemon;
GRANT SELECT, INSERT, UPDATE ON pgworkerd.workers TO pgworkerd_daemon;
-- The claim of every language (schema 19; README "Jobs"), also the daemon's: SECURITY
-- INVOKER, so the rights above are what it uses. A worker in another language logs in
-- as pgworkerd_daemon and calls it with renew_lease, complete_job, fail_job and the
-- other finishing functions (INVOKER too, EXECUTE to PUBLIC by default).
GRANT EXECUTE ON FUNCTION pgworkerd.claim_jobs(text, text[], text[], float8[], integer[],
                                               integer, integer[], jsonb, integer[],
                                               integer[])
      TO pgworkerd_daemon;
-- Attempt history (schema 12): rows are written by a trigger (SECURITY DEFINER) whatever
-- ends an attempt; the daemon adds only what it measured, and `show` reads them.
GRANT SELECT ON pgworkerd.attempts TO pgworkerd_daemon;
GRANT UPDATE (wall_seconds, cpu_user_seconds, cpu_system_seconds, peak_memory)
      ON pgworkerd.attempts TO pgworkerd_daemon;
-- Job logs (schema 15): the daemon upserts what its attempts printed (job_log_write:
-- INSERT ... ON CONFLICT DO UPDATE needs SELECT too); `logs` reads them. Rows go with
-- their job through a trigger (SECURITY DEFINER): no DELETE needed.
GRANT SELECT, INSERT ON pgworkerd.job_logs TO pgworkerd_daemon;
GRANT UPDATE (head, tail, total_bytes, omitted_bytes, finished, updated_at)
      ON pgworkerd.job_logs TO pgworkerd_daemon;
-- Pausing queues and handlers (`pgworkerd pause`/`resume --queue/--handler`, the claim
-- and `status` read what is paused; the functions are SECURITY DEFINER).
GRANT SELECT ON pgworkerd.paused TO pgworkerd_daemon;
GRANT EXECUTE ON FUNCTION pgworkerd.pause(text, text, text), pgworkerd.resume(text, text),
                          pgworkerd.pause_queue(text, text), pgworkerd.resume_queue(text),
                          pgworkerd.pause_handler(text, text), pgworkerd.resume_handler(text)
      TO pgworkerd_daemon;
-- Drains (`pgworkerd drain [--hand-back]`, `resume`, the dashboard's drain buttons): the
-- SECURITY DEFINER functions check every argument and change only the drain columns of
-- live daemons (schema 17).
GRANT EXECUTE ON FUNCTION pgworkerd.drain_request(text, text, boolean, interval, text[], text[]),
                          pgworkerd.drain_lift(text, text)
      TO pgworkerd_daemon;
-- Periodic jobs: daemons declare their schedules and fire ticks through the functions.
GRANT SELECT ON pgworkerd.schedules, pgworkerd.schedule_runs TO pgworkerd_daemon;
GRANT EXECUTE ON FUNCTION pgworkerd.schedule_declare(text, jsonb, text),
                          pgworkerd.schedule_fire(text, timestamptz, jsonb, text, text)
      TO pgworkerd_daemon;
-- Retention (schema 14): the fleet deletes finished jobs past their retention through
-- this SECURITY DEFINER function; the daemon has no DELETE on jobs, so it can remove
-- finished jobs older than a retention and nothing else.
GRANT EXECUTE ON FUNCTION pgworkerd.prune_finished_v1(float8, float8, float8, integer)
      TO pgworkerd_daemon;
-- Version 2 (schema 20): also old schedule runs and gone daemons' registry rows, each
-- bounded per call; v1 stays granted for daemons of an older release during an upgrade.
GRANT EXECUTE ON FUNCTION pgworkerd.prune_finished_v2(float8, float8, float8, float8, float8,
                                                      integer)
      TO pgworkerd_daemon;

GRANT EXECUTE ON FUNCTION pgworkerd.enqueue(text, jsonb, text, integer, timestamptz,
                                            interval, integer, text),
                          pgworkerd.enqueue_many(jsonb)
      TO pgworkerd_enqueuer;
-- with concurrency keys (0009)
GRANT EXECUTE ON FUNCTION pgworkerd.enqueue_v2(text, jsonb, text, integer, timestamptz,
                                               interval, integer, text, text),
                          pgworkerd.enqueue_many_v2(jsonb)
      TO pgworkerd_enqueuer;
-- (the enqueuer also needs to read the schema version for `pgworkerd enqueue`'s check)
GRANT SELECT ON pgworkerd.schema_version TO pgworkerd_enqueuer;

-- Operators who prune and retry: DELETE is only for `pgworkerd prune` (jobs at any
-- retention, and the registry rows of daemons long gone), EXECUTE for its deletion of
-- old schedule runs; the daemons' own retention needs none.
-- GRANT DELETE ON pgworkerd.jobs, pgworkerd.workers TO pgworkerd_daemon;
-- GRANT EXECUTE ON FUNCTION pgworkerd.schedule_runs_prune(interval) TO pgworkerd_daemon;

-- Behind PgBouncer in transaction mode, startup options are not passed on: set the
-- statement timeout on the role instead (and `statement_timeout = "0s"` in the config).
ALTER ROLE pgworkerd_daemon SET statement_timeout = '10s';
-- Bounds what one enqueue call may cost the server (a million-job enqueue_many runs ~15 s).
ALTER ROLE pgworkerd_enqueuer SET statement_timeout = '30s';
-- pgworkerd sets this search_path as a startup option too (PgBouncer drops it): functions
-- and operators resolve in pg_catalog only, so nothing planted in `public` or another
-- schema can stand in for a built-in in the daemon's statements. The SQL functions pin
-- it themselves. (An application that also uses pgworkerd_enqueuer for its own tables
-- must then schema-qualify them, or leave out the enqueuer's line.)
ALTER ROLE pgworkerd_daemon SET search_path = pg_catalog, pg_temp;
ALTER ROLE pgworkerd_enqueuer SET search_path = pg_catalog, pg_temp;

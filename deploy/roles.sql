-- Least-privilege roles for pgworkerd (run as the schema owner after `pgworkerd migrate`).
--   pgworkerd_daemon:   what `pgworkerd run`, drain, resume, status and jobs need.
--   pgworkerd_enqueuer: only enqueue (the SQL functions); it cannot read or change jobs.
-- Replace the passwords (or use another authentication method) and the schema name if you
-- changed it. The enqueue functions are SECURITY DEFINER, so enqueuers need no rights
-- on the table itself.

CREATE ROLE pgworkerd_daemon LOGIN PASSWORD 'change-me';
CREATE ROLE pgworkerd_enqueuer LOGIN PASSWORD 'change-me';

GRANT USAGE ON SCHEMA pgworkerd TO pgworkerd_daemon, pgworkerd_enqueuer;

GRANT SELECT ON pgworkerd.schema_version TO pgworkerd_daemon;
GRANT SELECT, UPDATE ON pgworkerd.jobs TO pgworkerd_daemon;
GRANT SELECT, INSERT, UPDATE ON pgworkerd.workers TO pgworkerd_daemon;

GRANT EXECUTE ON FUNCTION pgworkerd.enqueue(text, jsonb, text, integer, timestamptz,
                                            interval, integer, text),
                          pgworkerd.enqueue_many(jsonb)
      TO pgworkerd_enqueuer;
-- (the enqueuer also needs to read the schema version for `pgworkerd enqueue`'s check)
GRANT SELECT ON pgworkerd.schema_version TO pgworkerd_enqueuer;

-- Operators who prune and retry: DELETE is only for `pgworkerd prune`.
-- GRANT DELETE ON pgworkerd.jobs TO pgworkerd_daemon;

-- Behind PgBouncer in transaction mode, startup options are not passed on: set the
-- statement timeout on the role instead (and `statement_timeout = "0s"` in the config).
ALTER ROLE pgworkerd_daemon SET statement_timeout = '10s';

-- Roles for people (issue 21): what operators, dashboards and enqueuers may read and do.
-- compatible-with-code-of-schema: 5
--
-- An expand migration (README "Upgrading"): a column with a default and a new function; no
-- function changes. Older code runs on, and its enqueues fill the column too (through the
-- default). The roles themselves are in deploy/roles.sql, run after migrating.

-- Who enqueued a job: the role the session logged in as, so that an enqueuer, which may not
-- read the jobs table, can read and wait for its own jobs (job_get_v1) and no one else's.
-- session_user, not current_user: the enqueue functions are SECURITY DEFINER, so inside
-- them current_user is the schema's owner, while session_user stays the login (SET ROLE
-- changes neither it nor what job_get_v1 compares it with). A column default: no change to
-- the enqueue functions, and nothing measurable per insert
-- (bench/people_roles_bench.py: within 4 %, the noise of a shared 2-CPU VM). The column is
-- added first and its default set after, so the jobs already there keep NULL (enqueued
-- before anyone recorded it: no enqueuer reads them) instead of the migrating role's
-- name, and the table is not rewritten.
ALTER TABLE @schema@.jobs ADD COLUMN enqueued_by text;
ALTER TABLE @schema@.jobs ALTER COLUMN enqueued_by SET DEFAULT session_user;

-- One job as pgworkerd.get returns it (client.JobInfo's fields, in order), for a role that
-- may read it: the login that enqueued it (enqueued_by = session_user), or one that may
-- SELECT the jobs table (the daemon, operator and reader roles, the owner). Anyone else
-- gets no row, as for an id that does not exist: it learns nothing of other roles' jobs.
-- SECURITY DEFINER so that the enqueuer needs no right on the table; STABLE, one index
-- lookup by primary key: `pgworkerd.wait` calls it on every notification and poll.
-- PL/pgSQL rather than SQL: it keeps its plan for the session, where a SECURITY DEFINER
-- SQL function is planned on every call (twice the time, bench/people_roles_bench.py).
-- EXECUTE stays with PUBLIC (unlike the other SECURITY DEFINER functions): its predicate is
-- the check, so it shows no role more than that role may read anyway, and every role that
-- read jobs with pgworkerd.get before (SELECT on the table: the daemon role, an
-- application's own role) keeps doing so after the upgrade, before roles.sql runs again.
-- Calling it still needs USAGE on the schema.
CREATE FUNCTION @schema@.job_get_v1(job_id bigint)
RETURNS TABLE (id bigint, queue text, handler text, status text, priority integer,
               attempts integer, max_attempts integer, snoozes integer, result jsonb,
               progress jsonb, last_error text, cancel_requested boolean,
               run_at timestamptz, created_at timestamptz, started_at timestamptz,
               finished_at timestamptz)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT j.id, j.queue, j.handler, j.status::text, j.priority, j.attempts,
           j.max_attempts, j.snoozes, j.result, j.progress, j.last_error,
           j.cancel_requested, j.run_at, j.created_at, j.started_at, j.finished_at
      FROM @schema@.jobs j
     WHERE j.id = job_get_v1.job_id
       AND (j.enqueued_by = session_user
            OR has_table_privilege(session_user, '@schema@.jobs', 'SELECT'));
END;
$$;

-- The other-language path (issue 21): one stable claim, durable finishing functions.
-- compatible-with-code-of-schema: 5
--
-- An expand migration (README "Upgrading"): one new function, claim_jobs; the finishing
-- functions of 0005 and 0011 are replaced in place with the same signatures and results;
-- claim, claim_v2 and claim_v3 stay, each with a comment saying who still calls it. Code
-- of schema 5 (release 0.2) and later runs on as before.
--
-- Durable commits. The daemon's fenced statements (queries.sql) force
-- synchronous_commit = on for their own transaction; the SQL functions did not, so a
-- worker in another language had the server's default (with synchronous_commit = off, an
-- acknowledged claim or finish could be lost in a crash, and the job run twice). Now
-- claim_jobs and the finishing functions do it themselves, with
-- `PERFORM set_config('synchronous_commit', 'on', true)`: the SET LOCAL of the calling
-- transaction, which lasts until its COMMIT, the moment synchronous_commit is read. It
-- outlives the function because PostgreSQL restores at a function's exit only the
-- variables of the function's own SET clause (which is why synchronous_commit must never
-- go into that clause: `SET synchronous_commit = on` there would be undone before the
-- COMMIT). tests/integration/test_claim_jobs.py reads the setting after each call;
-- tests/fault/test_sql_durable_commit.py sees each call's COMMIT wait for a synchronous
-- standby, and crashes the server right after each acknowledged call.
--
-- Planning. The finishing functions find the job by primary key only, its status compared
-- as text, as the daemon's statements do (queries.sql job_renew): the partial index on
-- running jobs must never look attractive to a generic plan.

-- claim_jobs: the stable claim, for the daemon (queries.sql job_claim) and for workers in
-- any language (README "Jobs"). Named, documented arguments, each checked (a bad one
-- raises 22023 naming it, and claims nothing); then claim_v3's one implementation:
-- queues and handlers paused by `pgworkerd pause` are left out, fleet-wide limits and
-- per-key limits hold (as given by the caller: each claim applies its own caller's
-- limits, see claim_v3), expired leases are rescued, a drained worker claims nothing.
-- Its commit is durable whatever the server's synchronous_commit (see the 0019 header).
--   SELECT * FROM pgworkerd.claim_jobs(
--       worker => 'worker-1', queues => '{default,mail}', handlers => '{send_mail,export}',
--       lease_seconds => '{300,60}', free_slots => '{4,2}', max_jobs => 6,
--       max_running => '{NULL,10}', max_running_per_key => '{NULL,2}');
-- The per-handler arguments are arrays in the order of `handlers`, one element each.
CREATE FUNCTION @schema@.claim_jobs(
    worker text,                -- this worker's name; the finishing functions take it back
    queues text[],              -- the queues to claim from
    handlers text[],            -- the handlers this worker runs, each named once
    lease_seconds float8[],     -- per handler: the lease a claimed job gets (0 < s <= 100 y)
    free_slots integer[],       -- per handler: how many more jobs it may take now (>= 0)
    max_jobs integer,           -- at most this many jobs in all (>= 0)
    handler_max_attempts integer[] DEFAULT NULL,  -- per handler: overrides the job's own
    -- per handler: a JSON array of the queues (among `queues`) it claims from, or null for
    -- all of them; the whole argument NULL: every handler claims from all of them
    handler_queues jsonb DEFAULT NULL,
    max_running integer[] DEFAULT NULL,           -- per handler: fleet-wide, or NULL
    max_running_per_key integer[] DEFAULT NULL    -- per handler: per concurrency key, or NULL
)
RETURNS TABLE (
    id bigint, queue text, handler text, payload jsonb, priority integer, attempts integer,
    max_attempts integer, lease_token bigint, checkpoint jsonb, run_at timestamptz,
    created_at timestamptz, locked_until timestamptz, rescued boolean
)
LANGUAGE plpgsql
-- SECURITY INVOKER, like claim_v3: the caller needs pgworkerd_daemon's rights.
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    n integer := coalesce(cardinality(claim_jobs.handlers), 0);
    duplicated boolean := false;
    problem text;
BEGIN
    -- The checks are plain expressions (no subquery, so PL/pgSQL evaluates them without
    -- the executor: they cost the daemon's claims next to nothing), bar this one, which
    -- only a claim for several handlers needs.
    IF n > 1 THEN
        duplicated := (SELECT count(DISTINCT h) FROM unnest(claim_jobs.handlers) h) <> n;
    END IF;
    problem := CASE
        WHEN claim_jobs.worker IS NULL OR claim_jobs.worker = '' THEN
            'worker must name this worker (the finishing functions take the name back), not '
            || coalesce(quote_literal(claim_jobs.worker), 'NULL')
        WHEN claim_jobs.queues IS NULL OR array_ndims(claim_jobs.queues) > 1
             OR array_position(claim_jobs.queues, NULL) IS NOT NULL THEN
            'queues must be an array of queue names without NULL, not '
            || coalesce(left(claim_jobs.queues::text, 200), 'NULL')
        WHEN claim_jobs.handlers IS NULL OR array_ndims(claim_jobs.handlers) > 1
             OR array_position(claim_jobs.handlers, NULL) IS NOT NULL
             OR array_position(claim_jobs.handlers, '') IS NOT NULL OR duplicated THEN
            'handlers must be an array of handler names, each named once, without NULL or '
            || 'empty names, not '
            || coalesce(left(claim_jobs.handlers::text, 200), 'NULL')
        WHEN claim_jobs.lease_seconds IS NULL OR array_ndims(claim_jobs.lease_seconds) > 1
             OR cardinality(claim_jobs.lease_seconds) <> n
             -- NaN is above every number: refused by the second test
             OR (0 < ALL(claim_jobs.lease_seconds)
                 AND 3153600000 >= ALL(claim_jobs.lease_seconds)) IS NOT TRUE THEN
            'lease_seconds must give each handler its lease in seconds (above 0, at most '
            || '100 years), one per handler in the order of handlers, not '
            || coalesce(left(claim_jobs.lease_seconds::text, 200), 'NULL')
        WHEN claim_jobs.free_slots IS NULL OR array_ndims(claim_jobs.free_slots) > 1
             OR cardinality(claim_jobs.free_slots) <> n
             OR (0 <= ALL(claim_jobs.free_slots)) IS NOT TRUE THEN
            'free_slots must give each handler how many more jobs it may take (0 or more), '
            || 'one per handler in the order of handlers, not '
            || coalesce(left(claim_jobs.free_slots::text, 200), 'NULL')
        WHEN claim_jobs.max_jobs IS NULL OR claim_jobs.max_jobs < 0 THEN
            'max_jobs must be 0 or more, not ' || coalesce(claim_jobs.max_jobs::text, 'NULL')
        WHEN claim_jobs.handler_max_attempts IS NOT NULL
             AND (array_ndims(claim_jobs.handler_max_attempts) > 1
                  OR cardinality(claim_jobs.handler_max_attempts) <> n
                  OR (1 > ANY(claim_jobs.handler_max_attempts)) IS TRUE) THEN
            'handler_max_attempts must be NULL, or one per handler in the order of handlers, '
            || 'each NULL (the job''s own) or at least 1, not '
            || left(claim_jobs.handler_max_attempts::text, 200)
        WHEN claim_jobs.handler_queues IS NOT NULL
             AND (jsonb_typeof(claim_jobs.handler_queues) <> 'array'
                  OR jsonb_array_length(claim_jobs.handler_queues) <> n
                  -- strict: lax mode would look into the inner arrays as well
                  OR jsonb_path_exists(claim_jobs.handler_queues,
                                       'strict $[*] ? (@.type() != "null" && @.type() != "array")')
                  OR jsonb_path_exists(claim_jobs.handler_queues,
                                       'strict $[*] ? (@.type() == "array")[*] ? (@.type() != "string")'))
             THEN
            'handler_queues must be NULL, or a JSON array with one element per handler in the '
            || 'order of handlers, each null (all of queues) or an array of queue names, not '
            || left(claim_jobs.handler_queues::text, 200)
        WHEN claim_jobs.max_running IS NOT NULL
             AND (array_ndims(claim_jobs.max_running) > 1
                  OR cardinality(claim_jobs.max_running) <> n
                  OR (1 > ANY(claim_jobs.max_running)) IS TRUE) THEN
            'max_running must be NULL, or one per handler in the order of handlers, each '
            || 'NULL (no limit) or at least 1, not ' || left(claim_jobs.max_running::text, 200)
        WHEN claim_jobs.max_running_per_key IS NOT NULL
             AND (array_ndims(claim_jobs.max_running_per_key) > 1
                  OR cardinality(claim_jobs.max_running_per_key) <> n
                  OR (1 > ANY(claim_jobs.max_running_per_key)) IS TRUE) THEN
            'max_running_per_key must be NULL, or one per handler in the order of handlers, '
            || 'each NULL (no limit) or at least 1, not '
            || left(claim_jobs.max_running_per_key::text, 200)
    END;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgworkerd: claim_jobs: %', problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A durable commit (see the 0019 header: SET LOCAL here, never a SET clause).
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    RETURN QUERY
    SELECT * FROM @schema@.claim_v3(
        claim_jobs.worker, claim_jobs.queues, claim_jobs.handlers, claim_jobs.lease_seconds,
        claim_jobs.free_slots, claim_jobs.max_jobs, claim_jobs.handler_max_attempts,
        claim_jobs.handler_queues, claim_jobs.max_running, claim_jobs.max_running_per_key);
END;
$$;

-- Who still calls each claim (a contract migration drops the old ones once no supported
-- release calls them).
COMMENT ON FUNCTION @schema@.claim_jobs(text, text[], text[], float8[], integer[], integer,
                                        integer[], jsonb, integer[], integer[]) IS
    'The stable claim (schema 19) for the daemon and for workers in any language: pauses, '
    'fleet-wide and per-key limits, rescues, a durable commit. README "Jobs".';
COMMENT ON FUNCTION @schema@.claim_v3(text, text[], text[], float8[], integer[], integer,
                                      integer[], jsonb, integer[], integer[]) IS
    'The implementation behind claim_jobs. Called directly only by daemons built from '
    'schemas 9 to 18 (unreleased code before schema 19), during a rolling upgrade. New '
    'code calls claim_jobs (checked arguments, a durable commit).';
COMMENT ON FUNCTION @schema@.claim_v2(text, text[], text[], float8[], integer[], integer,
                                      integer[], jsonb) IS
    'Superseded; called by no release, only by unreleased daemons of schemas 6 to 8. It '
    'ignores pauses and fleet-wide limits. New code calls claim_jobs.';
COMMENT ON FUNCTION @schema@.claim(text, text[], text[], float8[], integer[], integer,
                                   integer[]) IS
    'Superseded; kept for release 0.2 daemons (schema 5) and SQL workers written against '
    'its README, during a rolling upgrade. It ignores pauses, fleet-wide limits and '
    'concurrency keys, and does not force a durable commit. New code calls claim_jobs.';

-- The finishing functions of 0005 and 0011, durable and by primary key (see above).

CREATE OR REPLACE FUNCTION @schema@.renew_lease(
    job_id bigint, worker text, token bigint, lease_seconds float8,
    progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS TABLE (cancel_requested boolean, locked_until timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- As the daemon's statements (0019): a durable commit whatever the server's default,
    -- and the job found by its primary key only (its status compared as text).
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    RETURN QUERY
    UPDATE @schema@.jobs j
       SET locked_until = now() + make_interval(secs => renew_lease.lease_seconds),
           progress = coalesce(renew_lease.progress, j.progress),
           checkpoint = coalesce(renew_lease.checkpoint, j.checkpoint),
           updated_at = now()
     WHERE j.id = renew_lease.job_id AND j.locked_by = renew_lease.worker
       AND j.lease_token = renew_lease.token AND j.status::text = 'running'
    RETURNING j.cancel_requested, j.locked_until;
END;
$$;

CREATE OR REPLACE FUNCTION @schema@.complete_job(
    job_id bigint, worker text, token bigint, result jsonb DEFAULT NULL,
    progress jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- As the daemon's statements (0019): a durable commit whatever the server's default,
    -- and the job found by its primary key only (its status compared as text).
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    UPDATE @schema@.jobs j
       SET status = 'completed', result = complete_job.result,
           progress = coalesce(complete_job.progress, j.progress),
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           finished_at = now(), updated_at = now()
     WHERE j.id = complete_job.job_id AND j.locked_by = complete_job.worker
       AND j.lease_token = complete_job.token AND j.status::text = 'running';
    RETURN FOUND;
END;
$$;

CREATE OR REPLACE FUNCTION @schema@.fail_job(
    job_id bigint, worker text, token bigint, error text,
    backoff_base float8 DEFAULT 10, backoff_max float8 DEFAULT 3600,
    progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS TABLE (status text, run_at timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- As the daemon's statements (0019): a durable commit whatever the server's default,
    -- and the job found by its primary key only (its status compared as text).
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    RETURN QUERY
    UPDATE @schema@.jobs j
       SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                         WHEN j.attempts >= j.max_attempts THEN 'dead'
                         ELSE 'pending' END::@schema@.job_status,
           run_at = CASE WHEN j.cancel_requested OR j.attempts >= j.max_attempts THEN j.run_at
                         ELSE now() + make_interval(secs =>
                              least(fail_job.backoff_max,
                                    fail_job.backoff_base
                                    * power(2::float8, least(j.attempts - 1, 60)::float8))
                              * (0.75 + 0.5 * random())) END,
           finished_at = CASE WHEN j.cancel_requested OR j.attempts >= j.max_attempts
                              THEN now() END,
           last_error = fail_job.error,
           progress = coalesce(fail_job.progress, j.progress),
           checkpoint = coalesce(fail_job.checkpoint, j.checkpoint),
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           updated_at = now()
     WHERE j.id = fail_job.job_id AND j.locked_by = fail_job.worker
       AND j.lease_token = fail_job.token AND j.status::text = 'running'
    RETURNING j.status::text, j.run_at;
END;
$$;

CREATE OR REPLACE FUNCTION @schema@.release_job(
    job_id bigint, worker text, token bigint,
    progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    new_status text;
BEGIN
    -- As the daemon's statements (0019): a durable commit whatever the server's default,
    -- and the job found by its primary key only (its status compared as text).
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    UPDATE @schema@.jobs j
       SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                         ELSE 'pending' END::@schema@.job_status,
           finished_at = CASE WHEN j.cancel_requested THEN now() END,
           attempts = j.attempts - 1,
           progress = coalesce(release_job.progress, j.progress),
           checkpoint = coalesce(release_job.checkpoint, j.checkpoint),
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           updated_at = now()
     WHERE j.id = release_job.job_id AND j.locked_by = release_job.worker
       AND j.lease_token = release_job.token AND j.status::text = 'running'
    RETURNING j.status::text INTO new_status;
    RETURN new_status;
END;
$$;

CREATE OR REPLACE FUNCTION @schema@.snooze_job(
    job_id bigint, worker text, token bigint, delay_seconds float8,
    max_snoozes integer DEFAULT 100,
    progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS TABLE (status text, run_at timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- As the daemon's statements (0019): a durable commit whatever the server's default,
    -- and the job found by its primary key only (its status compared as text).
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    -- (NaN is above every number in PostgreSQL: refused too)
    IF snooze_job.delay_seconds IS NULL
       OR NOT (snooze_job.delay_seconds BETWEEN 0 AND 2592000) THEN
        RAISE EXCEPTION 'pgworkerd: a snooze must be from 0 to 2592000 seconds (30 days), not %',
            coalesce(snooze_job.delay_seconds::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    UPDATE @schema@.jobs j
       SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                         ELSE 'pending' END::@schema@.job_status,
           run_at = CASE WHEN j.cancel_requested THEN j.run_at
                         ELSE now() + make_interval(secs => snooze_job.delay_seconds) END,
           finished_at = CASE WHEN j.cancel_requested THEN now() END,
           attempts = j.attempts - 1,
           snoozes = j.snoozes + 1,
           progress = coalesce(snooze_job.progress, j.progress),
           checkpoint = coalesce(snooze_job.checkpoint, j.checkpoint),
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           updated_at = now()
     WHERE j.id = snooze_job.job_id AND j.locked_by = snooze_job.worker
       AND j.lease_token = snooze_job.token AND j.status::text = 'running'
       AND j.snoozes < coalesce(snooze_job.max_snoozes, 100)
    RETURNING j.status::text, j.run_at;
    IF NOT FOUND THEN
        -- max_snoozes used up (or the lease lost: fail_job is fenced the same way)
        RETURN QUERY
        SELECT * FROM @schema@.fail_job(
            snooze_job.job_id, snooze_job.worker, snooze_job.token,
            'snoozed ' || coalesce(snooze_job.max_snoozes, 100)
                || ' times already (max_snoozes): this snooze counts as a failed attempt',
            progress => snooze_job.progress, checkpoint => snooze_job.checkpoint);
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION @schema@.give_up_job(job_id bigint, worker text, token bigint, reason text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- As the daemon's statements (0019): a durable commit whatever the server's default,
    -- and the job found by its primary key only (its status compared as text).
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    UPDATE @schema@.jobs j
       SET status = 'dead', last_error = give_up_job.reason,
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           finished_at = now(), updated_at = now()
     WHERE j.id = give_up_job.job_id AND j.locked_by = give_up_job.worker
       AND j.lease_token = give_up_job.token AND j.status::text = 'running';
    RETURN FOUND;
END;
$$;

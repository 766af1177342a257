-- Dependencies and deadlines at enqueue (issue 24 items 1 and 5): jobs' parents
-- (job_parents, the counts and policy on jobs, the trigger that resolves children when a
-- parent finishes), enqueue_many_v3/enqueue_v3 (after, after_index, on_parent_failure,
-- expires_at/expire_in, timeout), job_held_release for operators, and claim_jobs_v2
-- (expired jobs never start; a job's own timeout and whether it has parents reach the
-- daemon).
-- compatible-with-code-of-schema: 5
--
-- An expand migration: it adds nullable columns (and one with a constant default, no
-- rewrite), a table, an index, functions and a trigger whose WHEN is false for every
-- existing row. Older code keeps enqueueing, claiming and finishing as before.

ALTER TABLE @schema@.jobs
    ADD COLUMN parents_unfinished integer,
    ADD COLUMN parents_failed   integer,
    ADD COLUMN on_parent_failure text CONSTRAINT jobs_on_parent_failure_known CHECK (on_parent_failure IN ('cancel', 'run', 'hold')),
    ADD COLUMN has_children     boolean NOT NULL DEFAULT false,
    ADD COLUMN expires_at       timestamptz,
    ADD COLUMN timeout_seconds  double precision CONSTRAINT jobs_timeout_seconds_positive CHECK (timeout_seconds > 0 AND timeout_seconds <= 31536000);

-- Pending jobs with a deadline (0027), for claim_jobs_v2's end of expired jobs: only jobs
-- that have one are in it.
CREATE INDEX jobs_pending_expires_idx ON @schema@.jobs (expires_at)
    WHERE status = 'pending' AND expires_at IS NOT NULL;

-- Dependencies (0027): which jobs a job waits for, and what resolves it when they finish.
-- A job enqueued with "after" (enqueue_many_v3, enqueue.sql) gets a row here per parent,
-- counts its unfinished and failed parents in jobs.parents_unfinished/parents_failed,
-- and is inserted 'waiting' while some parent has not finished. Each parent's change of
-- status updates those counts in the same transaction (the trigger jobs_children_resolved
-- below), so the resolution is in the database, never in a daemon's memory: whoever
-- finishes the parent (a daemon, a worker in another language, an operator's cancel), the
-- child becomes pending in the transaction that commits the parent's end.

-- One row per (child, parent). No foreign keys: a TRUNCATE of jobs (tests, operators)
-- must keep working, and a pruned parent of a finished child leaves its row behind
-- (show says "pruned"); the rows of a deleted child go with it (job_parents_forget).
CREATE TABLE @schema@.job_parents (
    child_id  bigint NOT NULL,
    parent_id bigint NOT NULL,
    PRIMARY KEY (child_id, parent_id),
    CONSTRAINT job_parents_not_self CHECK (child_id <> parent_id)
);

-- A parent's children, for the resolution and for show.
CREATE INDEX job_parents_parent_idx ON @schema@.job_parents (parent_id);

-- A parent with children (jobs.has_children) changed status: update each waiting child's
-- counts, and apply what the child asked for:
--   the parent finished (completed, dead, cancelled): one fewer unfinished parent;
--   it ended dead or cancelled: one more failed parent, and a child whose
--     on_parent_failure is 'cancel' is cancelled at once, its reason in last_error
--     (which cascades: its own children see a cancelled parent);
--   it left a final status (an operator's retry of a dead parent): the reverse;
-- and a child with no unfinished parent left, and no failed one (or 'run'), becomes
-- pending at once, and the fleet is woken with the notification an insert sends
-- (notify_wake's payload). A 'hold' child with a failed parent stays waiting until an
-- operator releases it (job_held_release) or cancels it.
-- Concurrent parents of one child serialise on the child's row (the UPDATE below), so
-- each count is exact whatever order they commit in; a child being enqueued holds its
-- parents' rows locked until it commits (enqueue_many_v3), so no parent finishes unseen.
CREATE FUNCTION @schema@.job_children_resolve()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    unfinished_change integer :=
        CASE WHEN NEW.status IN ('completed', 'dead', 'cancelled')
                  AND OLD.status NOT IN ('completed', 'dead', 'cancelled') THEN -1
             WHEN OLD.status IN ('completed', 'dead', 'cancelled')
                  AND NEW.status NOT IN ('completed', 'dead', 'cancelled') THEN 1
             ELSE 0 END;
    failed_change integer := (NEW.status IN ('dead', 'cancelled'))::integer
                             - (OLD.status IN ('dead', 'cancelled'))::integer;
    woken integer;
BEGIN
    IF unfinished_change = 0 AND failed_change = 0 THEN
        RETURN NULL;
    END IF;
    WITH changed AS (
        UPDATE @schema@.jobs c
           SET parents_unfinished = c.parents_unfinished + unfinished_change,
               parents_failed = c.parents_failed + failed_change,
               status = CASE
                   WHEN failed_change > 0 AND c.on_parent_failure = 'cancel'
                       THEN 'cancelled'
                   WHEN c.parents_unfinished + unfinished_change = 0
                        AND (c.parents_failed + failed_change = 0
                             OR c.on_parent_failure = 'run')
                       THEN 'pending'
                   ELSE 'waiting' END::@schema@.job_status,
               finished_at = CASE WHEN failed_change > 0 AND c.on_parent_failure = 'cancel'
                                  THEN now() END,
               last_error = CASE WHEN failed_change > 0 AND c.on_parent_failure = 'cancel'
                                 THEN 'cancelled: parent job ' || NEW.id || ' ended '
                                      || NEW.status
                                 ELSE c.last_error END,
               updated_at = now()
          FROM @schema@.job_parents p
         WHERE p.parent_id = NEW.id AND c.id = p.child_id AND c.status = 'waiting'
        RETURNING c.id, c.queue, c.handler, c.status
    )
    SELECT count(*) INTO woken
      FROM (SELECT pg_notify(@schema_literal@ || '.wake',
                             json_build_object('q', ch.queue, 'h', ch.handler,
                                               'id', min(ch.id), 'n', count(*))::text)
              FROM changed ch
             WHERE ch.status = 'pending'
             GROUP BY ch.queue, ch.handler) AS sent;
    RETURN NULL;
END;
$$;

-- Only jobs that some child names (has_children) pay for it: the completion of any other
-- job evaluates this WHEN and nothing more.
CREATE TRIGGER jobs_children_resolved
    AFTER UPDATE OF status ON @schema@.jobs
    FOR EACH ROW
    WHEN (NEW.has_children AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION @schema@.job_children_resolve();

-- Deleted jobs take their own parent rows along (their rows as a parent stay: a finished
-- child's parents may be pruned before it; show reads "pruned").
CREATE FUNCTION @schema@.job_parents_forget()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        TRUNCATE @schema@.job_parents;
    ELSE
        DELETE FROM @schema@.job_parents p USING gone g WHERE p.child_id = g.id;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_parents_forget
    AFTER DELETE ON @schema@.jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.job_parents_forget();

CREATE TRIGGER jobs_parents_forget_all
    AFTER TRUNCATE ON @schema@.jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.job_parents_forget();

REVOKE EXECUTE ON FUNCTION @schema@.job_children_resolve() FROM PUBLIC;

REVOKE EXECUTE ON FUNCTION @schema@.job_parents_forget() FROM PUBLIC;

-- Whether some child of `parent_id` has not finished (retention keeps such a parent:
-- prune_finished_v2). Only asked for jobs with has_children.
CREATE FUNCTION @schema@.job_children_unfinished(parent_id bigint)
RETURNS boolean
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM @schema@.job_parents p
                     JOIN @schema@.jobs c ON c.id = p.child_id
                    WHERE p.parent_id = job_children_unfinished.parent_id
                      AND c.status NOT IN ('completed', 'dead', 'cancelled'));
$$;

-- An operator releases a held job (on_parent_failure 'hold', a parent ended dead or
-- cancelled): from now on it runs whatever its parents did ('run'), so it becomes pending
-- at once if no parent is unfinished, else when the last one finishes. Anything else
-- (no such job, not waiting, not held) is refused with 22023 and changes nothing.
-- Returns the job's status after the release. For pgworkerd_operator (roles.sql).
CREATE FUNCTION @schema@.job_held_release(job_id bigint)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    released record;
    found_status text;
BEGIN
    UPDATE @schema@.jobs j
       SET on_parent_failure = 'run',
           status = CASE WHEN j.parents_unfinished = 0 THEN 'pending'
                         ELSE 'waiting' END::@schema@.job_status,
           updated_at = now()
     WHERE j.id = job_held_release.job_id AND j.status = 'waiting'
       AND j.on_parent_failure = 'hold' AND j.parents_failed > 0
    RETURNING j.id, j.queue, j.handler, j.status::text AS status INTO released;
    IF NOT FOUND THEN
        SELECT j.status::text INTO found_status FROM @schema@.jobs j
         WHERE j.id = job_held_release.job_id;
        RAISE EXCEPTION 'pgworkerd: job % is not held for an operator (%)', job_id,
            CASE WHEN found_status IS NULL THEN 'no such job'
                 ELSE 'it is ' || found_status
                      || ', not waiting with a failed parent and on_parent_failure hold' END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF released.status = 'pending' THEN
        PERFORM pg_notify(@schema_literal@ || '.wake',
                          json_build_object('q', released.queue, 'h', released.handler,
                                            'id', released.id, 'n', 1)::text);
    END IF;
    RETURN released.status;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.job_held_release(bigint) FROM PUBLIC;

SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- Dependencies and deadlines (0027, issue 24): enqueue_many_v3 and enqueue_v3.

-- What is wrong with the keys enqueue_many_v3 adds to a job object (job `n` of `jobs`,
-- 1-based), or NULL when nothing is: an unknown key (listing every key v3 knows), then
--   after: an array of job ids (integers from 1), the parents named by id;
--   after_index: an array of 0-based positions of jobs EARLIER in the same call (a job
--     cannot wait for itself or a later one, so no call can make a cycle), none of them
--     a job with a dedupe_key (a dedupe hit would make the parent another, older job);
--   at most 1,000 parents in all (after and after_index together);
--   on_parent_failure: "cancel" (the default), "run" or "hold", only with parents;
--   no dedupe_key with parents (a waiting job is not in the dedupe index);
--   expires_at (a timestamp, in the future, before 9000-01-01) or expire_in (an interval
--     or a number of seconds, above 0, at most 100 years), not both, and not before the
--     job's run_at (it could never start);
--   timeout: a number of seconds or an interval, above 0, at most 365 days.
-- Called only for the jobs that carry one of those keys (or an unknown one).
CREATE FUNCTION @schema@.job_extras_problem(e jsonb, n bigint, jobs jsonb)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
SET intervalstyle = 'postgres'
AS $$
DECLARE
    known_keys constant text[] :=
        '{handler,payload,queue,priority,run_at,delay,max_attempts,dedupe_key,concurrency_key,'
        'after,after_index,on_parent_failure,expires_at,expire_in,timeout}';
    max_parents constant integer := 1000;
    parents integer := 0;
    item jsonb;
    expires timestamptz;
    starts timestamptz;
    seconds float8;
BEGIN
    IF e - known_keys <> '{}' THEN
        RETURN 'unknown key "' || (SELECT k FROM jsonb_object_keys(e - known_keys) k LIMIT 1)
               || '" (known: ' || array_to_string(known_keys, ', ') || ')';
    END IF;
    IF e ? 'after' AND jsonb_typeof(e->'after') <> 'null' THEN
        IF jsonb_typeof(e->'after') <> 'array' THEN
            RETURN 'after must be an array of job ids, not ' || jsonb_typeof(e->'after');
        END IF;
        parents := jsonb_array_length(e->'after');
        IF parents > max_parents THEN
            RETURN 'a job may have at most ' || max_parents || ' parents, not ' || parents;
        END IF;
        FOR item IN SELECT x FROM jsonb_array_elements(e->'after') x LOOP
            IF (CASE WHEN jsonb_typeof(item) <> 'number' THEN true
                     ELSE item::text::numeric % 1 <> 0
                          OR item::text::numeric NOT BETWEEN 1 AND 9223372036854775807 END)
            THEN
                RETURN 'after must hold job ids (integers from 1), not '
                       || left(item::text, 100);
            END IF;
        END LOOP;
    END IF;
    IF e ? 'after_index' AND jsonb_typeof(e->'after_index') <> 'null' THEN
        IF jsonb_typeof(e->'after_index') <> 'array' THEN
            RETURN 'after_index must be an array of positions of earlier jobs, not '
                   || jsonb_typeof(e->'after_index');
        END IF;
        parents := parents + jsonb_array_length(e->'after_index');
        IF parents > max_parents THEN
            RETURN 'a job may have at most ' || max_parents || ' parents, not ' || parents;
        END IF;
        FOR item IN SELECT x FROM jsonb_array_elements(e->'after_index') x LOOP
            IF (CASE WHEN jsonb_typeof(item) <> 'number' THEN true
                     ELSE item::text::numeric % 1 <> 0 END) THEN
                RETURN 'after_index must hold 0-based positions of jobs in this call, not '
                       || left(item::text, 100);
            END IF;
            IF item::text::numeric NOT BETWEEN 0 AND n - 2 THEN
                RETURN 'after_index may name only jobs earlier in the call (positions 0 to '
                       || (n - 2) || ' for job ' || n || '), not ' || item::text
                       || ': a job cannot wait for itself or a later job';
            END IF;
            IF jobs->(item::text::integer) ? 'dedupe_key'
               AND jsonb_typeof(jobs->(item::text::integer)->'dedupe_key') <> 'null' THEN
                RETURN 'after_index names job ' || (item::text::integer + 1)
                       || ', which has a dedupe_key: a parent in the same call cannot have one';
            END IF;
        END LOOP;
    END IF;
    IF e ? 'on_parent_failure' AND jsonb_typeof(e->'on_parent_failure') <> 'null' THEN
        IF NOT (jsonb_typeof(e->'on_parent_failure') = 'string'
                AND e->>'on_parent_failure' IN ('cancel', 'run', 'hold')) THEN
            RETURN 'on_parent_failure must be "cancel", "run" or "hold", not '
                   || left((e->'on_parent_failure')::text, 100);
        END IF;
        IF parents = 0 THEN
            RETURN 'on_parent_failure needs parents (after or after_index)';
        END IF;
    END IF;
    IF parents > 0 AND jsonb_typeof(e->'dedupe_key') = 'string' THEN
        RETURN 'a job with parents cannot have a dedupe_key';
    END IF;
    IF jsonb_typeof(e->'expires_at') IS NOT NULL AND jsonb_typeof(e->'expires_at') <> 'null' THEN
        IF jsonb_typeof(e->'expire_in') IS NOT NULL AND jsonb_typeof(e->'expire_in') <> 'null' THEN
            RETURN 'give expires_at or expire_in, not both';
        END IF;
        IF jsonb_typeof(e->'expires_at') <> 'string'
           OR NOT @schema@.readable(e->>'expires_at', 'timestamptz') THEN
            RETURN 'expires_at must be a timestamp with a time zone (such as '
                   || '2030-01-01T09:00:00Z), not ' || left((e->'expires_at')::text, 100);
        END IF;
        expires := (e->>'expires_at')::timestamptz;
        IF NOT isfinite(expires) OR expires >= '9000-01-01 00:00+00'::timestamptz THEN
            RETURN 'expires_at must be before 9000-01-01 UTC, not ' || (e->>'expires_at');
        END IF;
        IF expires <= now() THEN
            RETURN 'expires_at is in the past (' || (e->>'expires_at')
                   || '): the job could never start';
        END IF;
    ELSIF jsonb_typeof(e->'expire_in') IS NOT NULL AND jsonb_typeof(e->'expire_in') <> 'null' THEN
        IF jsonb_typeof(e->'expire_in') NOT IN ('string', 'number')
           OR NOT @schema@.readable(e->>'expire_in', 'interval') THEN
            RETURN 'expire_in must be an interval (such as "1 hour") or seconds, not '
                   || left((e->'expire_in')::text, 100);
        END IF;
        IF NOT ((e->>'expire_in')::interval > interval '0'
                AND (e->>'expire_in')::interval <= interval '100 years'
                AND extract(year FROM (e->>'expire_in')::interval) BETWEEN 0 AND 100
                AND extract(day FROM (e->>'expire_in')::interval) BETWEEN 0 AND 36525) THEN
            RETURN 'expire_in must be above 0 and at most 100 years, not ' || (e->>'expire_in');
        END IF;
        expires := now() + (e->>'expire_in')::interval;
    END IF;
    IF expires IS NOT NULL THEN
        -- run_at and delay are checked by enqueue_valid; here only when they are readable
        starts := CASE
            WHEN jsonb_typeof(e->'run_at') = 'string'
                 AND @schema@.readable(e->>'run_at', 'timestamptz')
                THEN (e->>'run_at')::timestamptz
            WHEN jsonb_typeof(e->'delay') IN ('string', 'number')
                 AND @schema@.readable(e->>'delay', 'interval')
                 AND (e->>'delay')::interval BETWEEN '-4000 years' AND '8000 years'
                THEN now() + (e->>'delay')::interval END;
        IF starts >= expires THEN
            RETURN 'expires at ' || expires || ', not after its run_at ' || starts
                   || ': the job could never start';
        END IF;
    END IF;
    IF jsonb_typeof(e->'timeout') IS NOT NULL AND jsonb_typeof(e->'timeout') <> 'null' THEN
        IF jsonb_typeof(e->'timeout') = 'number' THEN
            seconds := (e->>'timeout')::float8;
        ELSIF jsonb_typeof(e->'timeout') = 'string'
              AND @schema@.readable(e->>'timeout', 'interval')
              AND (e->>'timeout')::interval BETWEEN '-1000 years' AND '1000 years' THEN
            seconds := extract(epoch FROM (e->>'timeout')::interval);
        ELSE
            RETURN 'timeout must be seconds or an interval (such as "2 hours"), not '
                   || left((e->'timeout')::text, 100);
        END IF;
        IF NOT (seconds > 0 AND seconds <= 31536000) THEN
            RETURN 'timeout must be above 0 and at most 365 days, not ' || (e->>'timeout');
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

-- The timeout of a job object, in seconds (checked by job_extras_problem), NULL: none.
CREATE FUNCTION @schema@.job_timeout_seconds(e jsonb)
RETURNS float8
LANGUAGE sql
STABLE
BEGIN ATOMIC
    SELECT CASE jsonb_typeof(e->'timeout')
               WHEN 'number' THEN (e->>'timeout')::float8
               WHEN 'string' THEN extract(epoch FROM (e->>'timeout')::interval)::float8 END;
END;

-- enqueue_many_v2 with dependencies and deadlines: the same bounds, messages, dedupe and
-- notifications, and each job object may also carry
--   "after": [job ids]          parents named by id (jobs the caller may read: its own
--                               login's, or any with SELECT on jobs), at most 1,000;
--   "after_index": [positions]  parents earlier in the same call, 0-based;
--   "on_parent_failure": "cancel" | "run" | "hold"  (job_parents.sql says what each does);
--   "expires_at": timestamptz | "expire_in": interval or seconds  (not started after it);
--   "timeout": seconds or interval  (overrides the handler's timeout for this job).
-- A job with a parent that has not finished is inserted 'waiting'; one whose parents all
-- completed already is pending at once; one with a parent already dead or cancelled
-- follows its policy at once (cancelled, pending, or held). Every refusal (unknown or
-- unreadable parent id, a pruned one, a later or own position, over 1,000 parents, a bad
-- deadline) is SQLSTATE 22023 naming the job, and nothing is written.
-- The parents' rows stay locked (FOR NO KEY UPDATE) until the caller's transaction ends,
-- so a parent cannot finish unseen between this check and the child's commit: keep a
-- transaction that enqueues children short.
CREATE FUNCTION @schema@.enqueue_many_v3(jobs jsonb)
RETURNS bigint[]
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET intervalstyle = 'postgres'
AS $$
DECLARE
    extras constant text[] :=
        '{after,after_index,on_parent_failure,expires_at,expire_in,timeout}';
    v2_keys constant text[] :=
        '{handler,payload,queue,priority,run_at,delay,max_attempts,dedupe_key,concurrency_key}';
    total integer;
    ids bigint[];
    queues text[];
    parent_ids bigint[];
    readable_ids bigint[];
    missing bigint;
    bad record;
    problem text;
BEGIN
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' THEN
        RAISE EXCEPTION 'pgworkerd: enqueue_many expects a JSON array of job objects'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    total := jsonb_array_length(jobs);
    IF total = 0 THEN
        RETURN '{}';
    END IF;
    IF EXISTS (SELECT FROM @schema@.enqueue_bounds) THEN
        PERFORM @schema@.enqueue_bounds_check(jobs);
    END IF;
    -- the keys v3 adds, checked for the jobs that carry one (or an unknown key)
    FOR bad IN SELECT t.e, t.n FROM jsonb_array_elements(jobs) WITH ORDINALITY AS t(e, n)
                WHERE jsonb_typeof(t.e) = 'object'
                  AND (t.e ?| extras OR t.e - v2_keys - extras <> '{}')
                ORDER BY t.n LOOP
        problem := @schema@.job_extras_problem(bad.e, bad.n, jobs);
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'pgworkerd: job % of %: %', bad.n, total, problem
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;

    -- Parents named by id: each must be a job the caller may read (as job_get_v1), else
    -- it is unknown (never enqueued, pruned, or another login's: which of these is not
    -- said). Their rows are locked in id order (two enqueues naming the same parents
    -- never deadlock) and marked has_children; the mark is written even when it is
    -- already set, so that a finisher in REPEATABLE READ that did not see this child
    -- fails to serialise instead of missing it (a lock alone would not stop it).
    SELECT array_agg(DISTINCT p.id::numeric::bigint) INTO parent_ids
      FROM jsonb_array_elements(jobs) AS t(e),
           jsonb_array_elements_text(CASE WHEN jsonb_typeof(t.e) = 'object'
                                               AND jsonb_typeof(t.e->'after') = 'array'
                                          THEN t.e->'after' END) AS p(id);
    IF parent_ids IS NOT NULL THEN
        SELECT array_agg(l.id) INTO readable_ids
          FROM (SELECT j.id FROM @schema@.jobs j
                 WHERE j.id = ANY (parent_ids)
                   AND (j.enqueued_by = session_user
                        OR has_any_column_privilege(session_user, '@schema@.jobs', 'SELECT'))
                 ORDER BY j.id
                   FOR NO KEY UPDATE) AS l;
        SELECT p INTO missing FROM unnest(parent_ids) p
         WHERE p <> ALL (coalesce(readable_ids, '{}')) ORDER BY p LIMIT 1;
        IF missing IS NOT NULL THEN
            SELECT t.n INTO bad FROM jsonb_array_elements(jobs) WITH ORDINALITY AS t(e, n)
             WHERE jsonb_typeof(t.e->'after') = 'array' AND t.e->'after' @> to_jsonb(missing)
             ORDER BY t.n LIMIT 1;
            RAISE EXCEPTION 'pgworkerd: job % of %: after names job %, which does not exist '
                            '(never enqueued, or pruned) or is not readable by this login',
                            bad.n, total, missing
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        UPDATE @schema@.jobs j SET has_children = true WHERE j.id = ANY (parent_ids);
    END IF;

    WITH raw AS MATERIALIZED (
        SELECT n, e, CASE WHEN jsonb_typeof(e) = 'object' THEN e - 'concurrency_key' - extras
                          ELSE e END AS rest,
               CASE WHEN jsonb_typeof(e->'after') = 'array' THEN e->'after' END AS after,
               CASE WHEN jsonb_typeof(e->'after_index') = 'array'
                    THEN e->'after_index' END AS after_index
        FROM jsonb_array_elements(jobs) WITH ORDINALITY AS t(e, n)
    ), referenced AS (
        -- the positions some later job of the call waits for (0-based)
        SELECT DISTINCT x::integer AS position
          FROM raw, jsonb_array_elements_text(raw.after_index) AS x
    ), counted AS MATERIALIZED (
        SELECT raw.*,
               coalesce(jsonb_array_length(after), 0)
                 + coalesce(jsonb_array_length(after_index), 0) > 0 AS has_parents,
               CASE WHEN after IS NULL THEN 0 ELSE
                   (SELECT count(*) FROM @schema@.jobs pj
                     WHERE pj.id IN (SELECT x::numeric::bigint
                                       FROM jsonb_array_elements_text(after) x)
                       AND pj.status NOT IN ('completed', 'dead', 'cancelled')) END
               + CASE WHEN after_index IS NULL THEN 0 ELSE
                   (SELECT count(DISTINCT x) FROM jsonb_array_elements_text(after_index) x)
                 END AS unfinished,
               CASE WHEN after IS NULL THEN 0 ELSE
                   (SELECT count(*) FROM @schema@.jobs pj
                     WHERE pj.id IN (SELECT x::numeric::bigint
                                       FROM jsonb_array_elements_text(after) x)
                       AND pj.status IN ('dead', 'cancelled')) END AS failed
          FROM raw
    ), input AS MATERIALIZED (
        SELECT n, after, after_index, nextval('@schema@.jobs_id_seq') AS new_id,
               coalesce(e->>'queue', 'default') AS queue,
               CASE WHEN @schema@.enqueue_valid(rest)
                         AND coalesce(jsonb_typeof(e->'concurrency_key'), 'null')
                             IN ('string', 'null')
                         AND @schema@.concurrency_key_problem(e->>'concurrency_key') IS NULL
               THEN e->>'handler'
               ELSE @schema@.enqueue_reject_v2(
                   CASE WHEN jsonb_typeof(e) = 'object' THEN e - extras ELSE e END, n, total)
               END AS handler,
               coalesce(e->'payload', '{}') AS payload,
               coalesce((e->>'priority')::numeric::integer, 0) AS priority,
               coalesce((e->>'run_at')::timestamptz,
                        now() + coalesce((e->>'delay')::interval, interval '0')) AS run_at,
               coalesce((e->>'max_attempts')::numeric::integer, 5) AS max_attempts,
               e->>'dedupe_key' AS dedupe_key,
               e->>'concurrency_key' AS concurrency_key,
               CASE WHEN NOT has_parents THEN 'pending'
                    WHEN unfinished = 0
                         AND (failed = 0 OR e->>'on_parent_failure' = 'run') THEN 'pending'
                    ELSE 'waiting' END::@schema@.job_status AS status,
               CASE WHEN has_parents THEN unfinished END AS parents_unfinished,
               CASE WHEN has_parents THEN failed END AS parents_failed,
               CASE WHEN has_parents THEN coalesce(e->>'on_parent_failure', 'cancel')
                    END AS on_parent_failure,
               (n - 1) IN (SELECT position FROM referenced) AS has_children,
               coalesce((e->>'expires_at')::timestamptz,
                        now() + (e->>'expire_in')::interval) AS expires_at,
               @schema@.job_timeout_seconds(e) AS timeout_seconds
        FROM counted
    ), inserted AS (
        INSERT INTO @schema@.jobs AS j
            (id, queue, handler, payload, priority, run_at, max_attempts, dedupe_key,
             concurrency_key, status, parents_unfinished, parents_failed, on_parent_failure,
             has_children, expires_at, timeout_seconds)
        SELECT new_id, queue, handler, payload, priority, run_at, max_attempts, dedupe_key,
               concurrency_key, status, parents_unfinished, parents_failed,
               on_parent_failure, has_children, expires_at, timeout_seconds
        FROM input
        ORDER BY n
        ON CONFLICT (dedupe_key, handler)
            WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running')
            DO NOTHING
        RETURNING j.id, j.handler, j.dedupe_key
    ), edges AS (
        INSERT INTO @schema@.job_parents (child_id, parent_id)
        SELECT c.new_id, x::numeric::bigint
          FROM input c, jsonb_array_elements_text(c.after) AS x
        UNION
        SELECT c.new_id, p.new_id
          FROM input c, jsonb_array_elements_text(c.after_index) AS x
          JOIN input p ON p.n = x::integer + 1
    )
    SELECT array_agg(coalesce(
               ins.id,
               (SELECT min(i2.id) FROM inserted i2
                 WHERE i2.handler = input.handler AND i2.dedupe_key = input.dedupe_key),
               (SELECT ex.id FROM @schema@.jobs ex
                 WHERE ex.handler = input.handler AND ex.dedupe_key = input.dedupe_key
                   AND ex.status IN ('pending', 'running')))
           ORDER BY input.n),
           array_agg(DISTINCT input.queue)
      INTO ids, queues
      FROM input LEFT JOIN inserted ins ON ins.id = input.new_id;

    IF array_position(ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'pgworkerd: a job with an equal dedupe key changed concurrently; retry'
            USING ERRCODE = 'serialization_failure';
    END IF;

    -- A parent that had already ended dead or cancelled cancels a child whose policy says
    -- so, now: through an UPDATE, so that the child's own children in this call see it
    -- (jobs_children_resolved) and its waiters hear it (jobs_notify_finished).
    IF parent_ids IS NOT NULL THEN
        UPDATE @schema@.jobs c
           SET status = 'cancelled', finished_at = now(),
               last_error = 'cancelled: parent job '
                   || (SELECT min(pj.id) FROM @schema@.job_parents p
                         JOIN @schema@.jobs pj ON pj.id = p.parent_id
                        WHERE p.child_id = c.id AND pj.status IN ('dead', 'cancelled'))
                   || ' had ended dead or cancelled before it was enqueued'
         WHERE c.id = ANY (ids) AND c.status = 'waiting' AND c.parents_failed > 0
           AND c.on_parent_failure = 'cancel';
    END IF;

    PERFORM pg_notify(@schema_literal@ || '.jobs', q) FROM unnest(queues) AS q;
    RETURN ids;
END;
$$;

-- Enqueue one job with dependencies or deadlines: enqueue_v2's arguments, then after (job
-- ids), on_parent_failure, expires_at or expire_in, and timeout; one job of
-- enqueue_many_v3 (the same checks and messages, "job 1 of 1: ...").
CREATE FUNCTION @schema@.enqueue_v3(
    handler text,
    payload jsonb DEFAULT '{}',
    queue text DEFAULT 'default',
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    delay interval DEFAULT NULL,
    max_attempts integer DEFAULT 5,
    dedupe_key text DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    after bigint[] DEFAULT NULL,
    on_parent_failure text DEFAULT NULL,
    expires_at timestamptz DEFAULT NULL,
    expire_in interval DEFAULT NULL,
    timeout interval DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET intervalstyle = 'postgres'
AS $$
#variable_conflict use_column
BEGIN
    IF cardinality(enqueue_v3.after) > 1000 THEN
        -- refused before a JSON array of that size is built
        RAISE EXCEPTION 'pgworkerd: job 1 of 1: a job may have at most 1000 parents, not %',
            cardinality(enqueue_v3.after)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN (@schema@.enqueue_many_v3(jsonb_build_array(
        jsonb_build_object('payload', enqueue_v3.payload)
        || jsonb_strip_nulls(jsonb_build_object(
            'handler', enqueue_v3.handler, 'queue', enqueue_v3.queue,
            'priority', enqueue_v3.priority, 'run_at', enqueue_v3.run_at,
            'delay', enqueue_v3.delay::text, 'max_attempts', enqueue_v3.max_attempts,
            'dedupe_key', enqueue_v3.dedupe_key,
            'concurrency_key', enqueue_v3.concurrency_key,
            'after', to_jsonb(enqueue_v3.after),
            'on_parent_failure', enqueue_v3.on_parent_failure,
            'expires_at', enqueue_v3.expires_at,
            'expire_in', enqueue_v3.expire_in::text,
            'timeout', enqueue_v3.timeout::text)))))[1];
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.enqueue_many_v3(jsonb) FROM PUBLIC;

REVOKE EXECUTE ON FUNCTION @schema@.enqueue_v3(text, jsonb, text, integer, timestamptz, interval,
                                               integer, text, text, bigint[], text,
                                               timestamptz, interval, interval) FROM PUBLIC;

-- claim_jobs_v2 (0027, issue 24): claim_jobs, plus deadlines and dependencies.
--   * Absurd arrays are refused (22023) before anything: more than 1,000 handlers or
--     queues (a daemon serves a few dozen; architecture review 8.3).
--   * No job starts after its expires_at: jobs past it are ended first, as 'cancelled'
--     with the reason in last_error ("expired: ..."): pending ones, and running ones whose
--     lease ran out (a rescue would start a new attempt). Any claimer ends any expired
--     job (rows another claim holds are skipped, never waited for); the partial index
--     jobs_pending_expires_idx holds only pending jobs with a deadline, so a queue
--     without deadlines pays one probe of an empty index.
--   * Two more columns per claimed job: timeout_seconds (the job's own, overriding the
--     handler's; NULL: the handler's) and parents: for a job with parents only, a JSON
--     object of each parent's id (as text) and result (null unless it completed), read
--     here so that the handler sees them (job.parents) without a database connection;
--     NULL for every other job, which costs one test more. And has_children: some job
--     waits for this one (as claimed), so the daemon claims again with its completion,
--     in the transaction whose trigger releases those children.
CREATE FUNCTION @schema@.claim_jobs_v2(
    worker text,
    queues text[],
    handlers text[],
    lease_seconds float8[],
    free_slots integer[],
    max_jobs integer,
    handler_max_attempts integer[] DEFAULT NULL,
    handler_queues jsonb DEFAULT NULL,
    max_running integer[] DEFAULT NULL,
    max_running_per_key integer[] DEFAULT NULL
)
RETURNS TABLE (
    id bigint, queue text, handler text, payload jsonb, priority integer, attempts integer,
    max_attempts integer, lease_token bigint, checkpoint jsonb, run_at timestamptz,
    created_at timestamptz, locked_until timestamptz, rescued boolean,
    timeout_seconds float8, parents jsonb, has_children boolean
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- as claim_v3: a backlog's estimated cost would cross jit_above_cost (~60 ms of compiling
-- for a statement of a fraction of a millisecond)
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    claimed record;
    has_parents boolean;
BEGIN
    IF cardinality(claim_jobs_v2.handlers) > 1000 OR cardinality(claim_jobs_v2.queues) > 1000
    THEN
        RAISE EXCEPTION 'pgworkerd: claim_jobs_v2: at most 1000 handlers and 1000 queues, '
                        'not % and %', cardinality(claim_jobs_v2.handlers),
                        cardinality(claim_jobs_v2.queues)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Expired jobs end before the claim can see them (its now() is this one).
    UPDATE @schema@.jobs j
       SET status = 'cancelled', finished_at = now(), updated_at = now(),
           last_error = 'expired: not started by its expires_at ' || j.expires_at
      FROM (SELECT e.id FROM @schema@.jobs e
             WHERE e.status = 'pending' AND e.expires_at <= now()
             ORDER BY e.expires_at
             LIMIT 1000
               FOR UPDATE SKIP LOCKED) AS expired
     WHERE j.id = expired.id;
    UPDATE @schema@.jobs j
       SET status = 'cancelled', finished_at = now(), updated_at = now(),
           locked_by = NULL, locked_until = NULL,
           last_error = 'expired: its lease ran out after its expires_at ' || j.expires_at
                        || '; not started again'
      FROM (SELECT e.id FROM @schema@.jobs e
             WHERE e.status = 'running' AND e.locked_until < now()
               AND e.expires_at <= now()
               FOR UPDATE SKIP LOCKED) AS expired
     WHERE j.id = expired.id;
    -- One row at a time: the look-up of each claimed job's row is a statement of its own,
    -- whose snapshot sees the claim (a join in the claim's statement would read rows as
    -- they were before it, and miss a job enqueued meanwhile that the claim took).
    FOR claimed IN
        SELECT * FROM @schema@.claim_jobs(
            claim_jobs_v2.worker, claim_jobs_v2.queues, claim_jobs_v2.handlers,
            claim_jobs_v2.lease_seconds, claim_jobs_v2.free_slots, claim_jobs_v2.max_jobs,
            claim_jobs_v2.handler_max_attempts, claim_jobs_v2.handler_queues,
            claim_jobs_v2.max_running, claim_jobs_v2.max_running_per_key)
    LOOP
        id := claimed.id; queue := claimed.queue; handler := claimed.handler;
        payload := claimed.payload; priority := claimed.priority;
        attempts := claimed.attempts; max_attempts := claimed.max_attempts;
        lease_token := claimed.lease_token; checkpoint := claimed.checkpoint;
        run_at := claimed.run_at; created_at := claimed.created_at;
        locked_until := claimed.locked_until; rescued := claimed.rescued;
        SELECT j.timeout_seconds, j.parents_unfinished IS NOT NULL, j.has_children
          INTO timeout_seconds, has_parents, has_children
          FROM @schema@.jobs j WHERE j.id = claimed.id;
        parents := NULL;
        IF has_parents THEN
            -- {"<parent id>": its result (null unless it completed, or if pruned)}
            SELECT jsonb_object_agg(p.parent_id::text, pj.result) INTO parents
              FROM @schema@.job_parents p
              LEFT JOIN @schema@.jobs pj ON pj.id = p.parent_id
             WHERE p.child_id = claimed.id;
        END IF;
        RETURN NEXT;
    END LOOP;
END;
$$;

COMMENT ON FUNCTION @schema@.claim_jobs_v2(text, text[], text[], float8[], integer[],
                                           integer, integer[], jsonb, integer[], integer[]) IS
    'claim_jobs, ending jobs past their expires_at first, with each job''s own timeout and '
    'its parents'' results (schema 27): what the daemon calls. docs/reference/sql-api.md.';

REVOKE EXECUTE ON FUNCTION
    @schema@.claim_jobs_v2(text, text[], text[], float8[], integer[], integer, integer[],
                           jsonb, integer[], integer[])
    FROM PUBLIC;

-- Retention keeps a parent while one of its children has not finished.
CREATE OR REPLACE FUNCTION @schema@.prune_finished_v2(
    p_completed float8, p_cancelled float8, p_dead float8,
    p_schedule_runs float8, p_gone_daemons float8, p_batch integer,
    OUT deleted integer, OUT schedule_runs_deleted integer, OUT daemons_deleted integer,
    OUT live_daemons integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    floor_seconds float8;
    n integer;
    schedule_name text;
    runs_cutoff timestamptz;
    oldest timestamptz;
    keep_from timestamptz;
BEGIN
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 10000 THEN
        RAISE EXCEPTION 'prune_finished_v2: batch must be 1..10000, not %', p_batch
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- (NaN sorts above every number in PostgreSQL: the upper bound refuses it too)
    IF EXISTS (SELECT 1
                 FROM unnest(ARRAY[p_completed, p_cancelled, p_dead, p_schedule_runs,
                                   p_gone_daemons]) r
                WHERE r < 0 OR r > 100 * 365.25 * 86400) THEN
        RAISE EXCEPTION 'prune_finished_v2: a retention must be from 0 to 100 years in seconds'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The floor (0022): for a caller that may not delete jobs itself (the daemon role).
    IF NOT has_table_privilege(session_user, '@schema@.jobs', 'DELETE') THEN
        SELECT f.min_seconds INTO floor_seconds FROM @schema@.retention_floor f;
        IF EXISTS (SELECT 1 FROM unnest(ARRAY[p_completed, p_cancelled, p_dead]) r
                    WHERE r < floor_seconds) THEN
            RAISE EXCEPTION 'prune_finished_v2: a retention of finished jobs below % seconds '
                            '(the floor an operator set) is refused', floor_seconds
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Raise [retention] in the config, or have an operator lower the '
                             'floor: SELECT ' || @schema_literal@
                             || '.retention_floor_set(seconds).';
        END IF;
    END IF;
    SELECT count(*) INTO live_daemons FROM @schema@.workers WHERE state <> 'gone';
    IF NOT pg_try_advisory_xact_lock(
            hashtextextended('pgworkerd.retention:' || @schema_literal@, 0)) THEN
        RETURN;  -- the counts stay NULL: another daemon is pruning
    END IF;

    -- A parent stays while one of its children has not finished (schema 27): the child
    -- reads its parents' results at each claim, and show and explain name them.
    -- One statement per status, its status written out: only a literal lets the planner
    -- use that status's partial index (a parameter could be any status). The ids first
    -- (ARRAY), then the delete by primary key: never a join that reads the whole table.
    deleted := 0;
    IF p_completed IS NOT NULL THEN
        DELETE FROM @schema@.jobs
         WHERE id = ANY (ARRAY(
                   SELECT id FROM @schema@.jobs
                    WHERE status = 'completed'
                      AND finished_at < now() - make_interval(secs => p_completed)
                      AND NOT (has_children AND @schema@.job_children_unfinished(id))
                    ORDER BY finished_at
                    LIMIT p_batch - deleted
                    FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS n = ROW_COUNT;
        deleted := deleted + n;
    END IF;
    IF p_cancelled IS NOT NULL AND deleted < p_batch THEN
        DELETE FROM @schema@.jobs
         WHERE id = ANY (ARRAY(
                   SELECT id FROM @schema@.jobs
                    WHERE status = 'cancelled'
                      AND finished_at < now() - make_interval(secs => p_cancelled)
                      AND NOT (has_children AND @schema@.job_children_unfinished(id))
                    ORDER BY finished_at
                    LIMIT p_batch - deleted
                    FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS n = ROW_COUNT;
        deleted := deleted + n;
    END IF;
    IF p_dead IS NOT NULL AND deleted < p_batch THEN
        DELETE FROM @schema@.jobs
         WHERE id = ANY (ARRAY(
                   SELECT id FROM @schema@.jobs
                    WHERE status = 'dead'
                      AND finished_at < now() - make_interval(secs => p_dead)
                      AND NOT (has_children AND @schema@.job_children_unfinished(id))
                    ORDER BY finished_at
                    LIMIT p_batch - deleted
                    FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS n = ROW_COUNT;
        deleted := deleted + n;
    END IF;

    schedule_runs_deleted := 0;
    IF p_schedule_runs IS NOT NULL THEN
        runs_cutoff := now() - make_interval(secs => p_schedule_runs);
        FOR schedule_name IN SELECT s.name FROM @schema@.schedules s ORDER BY s.name LOOP
            EXIT WHEN schedule_runs_deleted >= p_batch;
            SELECT min(r.tick) INTO oldest
              FROM @schema@.schedule_runs r WHERE r.schedule = schedule_name;
            CONTINUE WHEN oldest IS NULL OR oldest >= runs_cutoff;
            SELECT least(
                       runs_cutoff,
                       (SELECT max(r.tick) FROM @schema@.schedule_runs r
                         WHERE r.schedule = schedule_name),
                       (SELECT min(recent.tick)
                          FROM (SELECT r.job_id, r.tick FROM @schema@.schedule_runs r
                                 WHERE r.schedule = schedule_name AND r.job_id IS NOT NULL
                                 ORDER BY r.tick DESC LIMIT 100) recent
                          JOIN @schema@.jobs j ON j.id = recent.job_id
                         WHERE j.status IN ('pending', 'running')))
              INTO keep_from;
            DELETE FROM @schema@.schedule_runs r
             WHERE r.schedule = schedule_name
               AND r.tick = ANY (ARRAY(
                       SELECT o.tick FROM @schema@.schedule_runs o
                        WHERE o.schedule = schedule_name AND o.tick < keep_from
                        ORDER BY o.tick
                        LIMIT p_batch - schedule_runs_deleted
                        FOR UPDATE SKIP LOCKED));
            GET DIAGNOSTICS n = ROW_COUNT;
            schedule_runs_deleted := schedule_runs_deleted + n;
        END LOOP;
    END IF;

    daemons_deleted := 0;
    IF p_gone_daemons IS NOT NULL THEN
        DELETE FROM @schema@.workers
         WHERE id = ANY (ARRAY(
                   SELECT w.id FROM @schema@.workers w
                    WHERE w.state = 'gone'
                      AND coalesce(w.stopped_at, w.heartbeat_at)
                          < now() - make_interval(secs => p_gone_daemons)
                    ORDER BY coalesce(w.stopped_at, w.heartbeat_at)
                    LIMIT p_batch
                    FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS daemons_deleted = ROW_COUNT;
    END IF;
END;
$$;

-- A rolling upgrade (as 0022's last block): who may call a function the new release
-- calls in its stead gets its successor now, so that new daemons and applications run
-- before roles.sql is applied again: claim_jobs -> claim_jobs_v2 (the daemon role),
-- enqueue_v2 / enqueue_many_v2 -> enqueue_v3 / enqueue_many_v3 (the enqueuer role).
DO $$
DECLARE
    pair text[];
    grantee text;
BEGIN
    FOREACH pair SLICE 1 IN ARRAY ARRAY[
        ['@schema@.claim_jobs(text, text[], text[], float8[], integer[], integer, integer[], '
         'jsonb, integer[], integer[])',
         '@schema@.claim_jobs_v2(text, text[], text[], float8[], integer[], integer, '
         'integer[], jsonb, integer[], integer[])'],
        ['@schema@.enqueue_v2(text, jsonb, text, integer, timestamptz, interval, integer, '
         'text, text)',
         '@schema@.enqueue_v3(text, jsonb, text, integer, timestamptz, interval, integer, '
         'text, text, bigint[], text, timestamptz, interval, interval)'],
        ['@schema@.enqueue_many_v2(jsonb)', '@schema@.enqueue_many_v3(jsonb)']]
    LOOP
        FOR grantee IN
            SELECT DISTINCT r.rolname
              FROM pg_catalog.pg_proc p
             CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
              JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
             WHERE p.oid = pair[1]::regprocedure AND a.privilege_type = 'EXECUTE'
               AND a.grantee <> p.proowner
        LOOP
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %I', pair[2], grantee);
        END LOOP;
    END LOOP;
END
$$;

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
-- each count is exact whatever order they commit in (a statement takes all its parents'
-- waiting children's rows first, in id order: statement_locks_take, batches.sql); a
-- child being enqueued holds its parents' rows locked until it commits
-- (enqueue_many_v3), so no parent finishes unseen.
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
    -- the statement's batches' and children's rows, in id order (batches.sql, 0032)
    PERFORM @schema@.statement_locks_take();
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
      FROM (SELECT @schema@.workers_wake(ch.queue, ch.handler, min(ch.id), count(*), 0, 0)
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
        PERFORM @schema@.workers_wake(released.queue, released.handler, released.id, 1, 0, 0);
    END IF;
    RETURN released.status;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.job_held_release(bigint) FROM PUBLIC;

-- Batches (issue 24 item 2; docs/guide/batches.md): the batches table, jobs.batch_id, the
-- trigger that counts a member's final status and releases the callback, batch_enqueue
-- and batch_members_page, and prune_finished_v2 keeping a batch's members until its
-- callback has finished.
-- compatible-with-code-of-schema: 5
--
-- An expand migration: it adds a nullable column (no rewrite), a table, an index, functions
-- and triggers whose WHEN is false for every existing row, and replaces prune_finished_v2
-- with a body that keeps the same signature and only keeps more rows (batch members).
-- Older code keeps enqueueing, claiming, finishing and pruning as before. The declaration
-- is objects/batches.sql (and jobs.sql, retention.sql); this is the same text.

ALTER TABLE @schema@.jobs ADD COLUMN batch_id bigint;

-- Batches (0030, issue 24 item 2; docs/guide/batches.md): N member jobs and one callback
-- job, inserted in one transaction by batch_enqueue. The callback waits ('waiting', never
-- claimed) until every member has finished (completed, dead or cancelled: a batch's
-- callback always runs, whatever its members did) and then becomes pending at once.
-- Each member's change of final status updates its batch's counts in the transaction that
-- commits it (the trigger jobs_batch_counted), so the release is in the database: whoever
-- finishes the last member (a daemon, another language's worker, an operator's cancel),
-- the callback is pending when that commits. No job_parents rows: one counter row per
-- batch, whatever its size.

-- One row per batch. No foreign key to jobs (a TRUNCATE of jobs must keep working): the
-- callback's deletion takes its batch along (batches_forget).
CREATE TABLE @schema@.batches (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    callback_id bigint NOT NULL,
    -- how many member jobs, and how many of them are completed, dead and cancelled now
    members     integer NOT NULL,
    completed   integer NOT NULL DEFAULT 0,
    dead        integer NOT NULL DEFAULT 0,
    cancelled   integer NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- when the last member finished and the callback became pending; NULL before
    released_at timestamptz,
    CONSTRAINT batches_members_bounded CHECK (members BETWEEN 1 AND 100000),
    CONSTRAINT batches_counts_bounded CHECK (
        completed >= 0 AND dead >= 0 AND cancelled >= 0
        AND completed + dead + cancelled <= members)
);

-- The batch of a callback (show, explain, the daemon's read before a callback starts).
CREATE UNIQUE INDEX batches_callback_idx ON @schema@.batches (callback_id);

-- A batch's members (their outcomes for the callback, show, retention): only members are
-- in it.
CREATE INDEX jobs_batch_idx ON @schema@.jobs (batch_id, id) WHERE batch_id IS NOT NULL;

-- A member's status changed to or from a final one: update its batch's counts, and when
-- the last member has finished, make the callback pending and wake the fleet (the
-- notification an insert sends). Concurrent members of one batch serialise on the batch's
-- row (the UPDATE below) for as long as their transactions last, so each count is exact
-- whatever order they commit in, and exactly one of them sees the last finish. A member
-- that leaves a final status after the release (an operator's retry) is counted again,
-- but the callback, which ran or is running, is not released twice.
CREATE FUNCTION @schema@.batch_member_count()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    completed_change integer := (NEW.status = 'completed')::integer
                                - (OLD.status = 'completed')::integer;
    dead_change integer := (NEW.status = 'dead')::integer - (OLD.status = 'dead')::integer;
    cancelled_change integer := (NEW.status = 'cancelled')::integer
                                - (OLD.status = 'cancelled')::integer;
    counted record;
    released record;
BEGIN
    IF completed_change = 0 AND dead_change = 0 AND cancelled_change = 0 THEN
        RETURN NULL;
    END IF;
    UPDATE @schema@.batches b
       SET completed = b.completed + completed_change,
           dead = b.dead + dead_change,
           cancelled = b.cancelled + cancelled_change,
           released_at = CASE WHEN b.completed + completed_change + b.dead + dead_change
                                   + b.cancelled + cancelled_change = b.members
                              THEN coalesce(b.released_at, now())
                              ELSE b.released_at END
     WHERE b.id = NEW.batch_id
    RETURNING b.callback_id, b.completed + b.dead + b.cancelled = b.members AS all_finished
      INTO counted;
    IF FOUND AND counted.all_finished THEN
        UPDATE @schema@.jobs c
           SET status = 'pending', updated_at = now()
         WHERE c.id = counted.callback_id AND c.status = 'waiting'
        RETURNING c.id, c.queue, c.handler INTO released;
        IF FOUND THEN
            PERFORM pg_notify(@schema_literal@ || '.wake',
                              json_build_object('q', released.queue, 'h', released.handler,
                                                'id', released.id, 'n', 1)::text);
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

-- Only members (batch_id set) pay for it: the completion of any other job evaluates this
-- WHEN and nothing more.
CREATE TRIGGER jobs_batch_counted
    AFTER UPDATE OF status ON @schema@.jobs
    FOR EACH ROW
    WHEN (NEW.batch_id IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION @schema@.batch_member_count();

-- A deleted callback takes its batch along, and the batch's members with it (retention
-- prunes a batch whole: a member stays while its callback has not finished, see
-- prune_finished_v2, and goes with the callback at the latest).
CREATE FUNCTION @schema@.batches_forget()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    gone_batches bigint[];
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        TRUNCATE @schema@.batches;
        RETURN NULL;
    END IF;
    WITH forgotten AS (
        DELETE FROM @schema@.batches b USING gone g WHERE b.callback_id = g.id
        RETURNING b.id
    )
    SELECT array_agg(f.id) INTO gone_batches FROM forgotten f;
    IF gone_batches IS NOT NULL THEN
        DELETE FROM @schema@.jobs m WHERE m.batch_id = ANY (gone_batches);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_batches_forget
    AFTER DELETE ON @schema@.jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.batches_forget();

CREATE TRIGGER jobs_batches_forget_all
    AFTER TRUNCATE ON @schema@.jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.batches_forget();

REVOKE EXECUTE ON FUNCTION @schema@.batch_member_count() FROM PUBLIC;

REVOKE EXECUTE ON FUNCTION @schema@.batches_forget() FROM PUBLIC;

-- Whether the callback of batch `batch_id` has not finished yet (retention keeps the
-- batch's members until it has: the callback reads their outcomes when it starts).
CREATE FUNCTION @schema@.batch_callback_unfinished(batch_id bigint)
RETURNS boolean
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM @schema@.batches b
                     JOIN @schema@.jobs c ON c.id = b.callback_id
                    WHERE b.id = batch_callback_unfinished.batch_id
                      AND c.status NOT IN ('completed', 'dead', 'cancelled'));
$$;

-- Enqueue a batch: `jobs`, a JSON array of 1 to 100,000 job objects (enqueue_many_v3's
-- keys, checks and messages, except dedupe_key: a dedupe hit would make an older job a
-- member), and `then`, one job object (the same keys, without dedupe_key, after or
-- after_index), the callback. All in one transaction: the callback is inserted 'waiting',
-- the members as enqueue_many_v3 inserts them, each marked with the batch. Returns the
-- batch's id, the callback's id and the members' ids in input order. Anything refused
-- raises 22023 with what and why, and nothing is inserted.
CREATE FUNCTION @schema@.batch_enqueue(
    jobs jsonb, "then" jsonb,
    OUT batch_id bigint, OUT callback_id bigint, OUT member_ids bigint[])
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    total integer;
    bad bigint;
    counts record;
BEGIN
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' THEN
        RAISE EXCEPTION 'pgworkerd: batch_enqueue: jobs must be a JSON array of job objects, '
                        'not %', coalesce(jsonb_typeof(jobs), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    total := jsonb_array_length(jobs);
    IF total = 0 THEN
        RAISE EXCEPTION 'pgworkerd: batch_enqueue: a batch needs at least one member job '
                        '(for a lone job, enqueue the callback itself)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF total > 100000 THEN
        RAISE EXCEPTION 'pgworkerd: batch_enqueue: a batch holds at most 100000 member jobs, '
                        'not %; split it into several batches', total
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF "then" IS NULL OR jsonb_typeof("then") <> 'object' THEN
        RAISE EXCEPTION 'pgworkerd: batch_enqueue: then (the callback) must be one job object, '
                        'not %', coalesce(jsonb_typeof("then"), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF "then" ?| '{dedupe_key,after,after_index}' THEN
        RAISE EXCEPTION 'pgworkerd: batch_enqueue: then (the callback) may not have '
                        'dedupe_key, after or after_index: it waits for the batch''s members'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT t.n INTO bad FROM jsonb_array_elements(jobs) WITH ORDINALITY AS t(e, n)
     WHERE jsonb_typeof(t.e) = 'object' AND t.e ? 'dedupe_key'
     ORDER BY t.n LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'pgworkerd: batch_enqueue: job % of %: a batch member may not have a '
                        'dedupe_key (a dedupe hit would make an older job a member)', bad, total
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    BEGIN
        callback_id := (@schema@.enqueue_many_v3(jsonb_build_array("then")))[1];
    EXCEPTION WHEN invalid_parameter_value THEN
        RAISE EXCEPTION 'pgworkerd: batch_enqueue: then (the callback): %',
                        regexp_replace(SQLERRM, '^pgworkerd: job 1 of 1: ', '')
            USING ERRCODE = 'invalid_parameter_value';
    END;
    UPDATE @schema@.jobs c SET status = 'waiting' WHERE c.id = callback_id;
    INSERT INTO @schema@.batches (callback_id, members)
    VALUES (batch_enqueue.callback_id, total)
    RETURNING id INTO batch_id;

    member_ids := @schema@.enqueue_many_v3(jobs);
    UPDATE @schema@.jobs m SET batch_id = batch_enqueue.batch_id WHERE m.id = ANY (member_ids);
    -- members that are final already (a parent named by "after" had failed: cancelled at
    -- insert) count now; if all are, the callback is pending at once
    SELECT count(*) FILTER (WHERE m.status = 'completed') AS completed,
           count(*) FILTER (WHERE m.status = 'dead') AS dead,
           count(*) FILTER (WHERE m.status = 'cancelled') AS cancelled
      INTO counts
      FROM @schema@.jobs m
     WHERE m.id = ANY (member_ids) AND m.status IN ('completed', 'dead', 'cancelled');
    IF counts.completed + counts.dead + counts.cancelled > 0 THEN
        UPDATE @schema@.batches b
           SET completed = counts.completed, dead = counts.dead, cancelled = counts.cancelled,
               released_at = CASE WHEN counts.completed + counts.dead + counts.cancelled
                                       = total THEN now() END
         WHERE b.id = batch_enqueue.batch_id;
        IF counts.completed + counts.dead + counts.cancelled = total THEN
            UPDATE @schema@.jobs c SET status = 'pending' WHERE c.id = callback_id;
        END IF;
    END IF;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.batch_enqueue(jsonb, jsonb) FROM PUBLIC;

-- A batch's members after `after_id` (0: from the first), at most `max_members` (1 to
-- 1000), in id order: id, status, result, last_error. For the login that enqueued the
-- batch's callback (or one that may read jobs): a callback pages past the outcomes it was
-- handed (job.batch["outcomes"] stops at 100). Refused (22023): no such batch readable by
-- this login, or a bad page size.
CREATE FUNCTION @schema@.batch_members_page(batch_id bigint, after_id bigint,
                                            max_members integer)
RETURNS TABLE (id bigint, status text, result jsonb, last_error text)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF max_members IS NULL OR max_members NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'pgworkerd: batch_members_page: max_members must be 1 to 1000, not %',
                        coalesce(max_members::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM @schema@.batches b JOIN @schema@.jobs c ON c.id = b.callback_id
                    WHERE b.id = batch_members_page.batch_id
                      AND (c.enqueued_by = session_user
                           OR has_any_column_privilege(session_user, '@schema@.jobs',
                                                       'SELECT'))) THEN
        RAISE EXCEPTION 'pgworkerd: batch_members_page: batch % does not exist (or was pruned) '
                        'or is not readable by this login', batch_id
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
        SELECT m.id, m.status::text, m.result, m.last_error
          FROM @schema@.jobs m
         WHERE m.batch_id = batch_members_page.batch_id
           AND m.id > coalesce(batch_members_page.after_id, 0)
         ORDER BY m.id
         LIMIT max_members;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.batch_members_page(bigint, bigint, integer) FROM PUBLIC;

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
    -- A batch's member stays while its batch's callback has not finished (schema 30):
    -- the callback reads the members' outcomes when it starts (batches.sql).
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
                      AND NOT (batch_id IS NOT NULL
                               AND @schema@.batch_callback_unfinished(batch_id))
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
                      AND NOT (batch_id IS NOT NULL
                               AND @schema@.batch_callback_unfinished(batch_id))
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
                      AND NOT (batch_id IS NOT NULL
                               AND @schema@.batch_callback_unfinished(batch_id))
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

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

-- Lock order (0032). A statement that finishes jobs of several batches, or parents of
-- several waiting children, has its AFTER triggers (below, and jobs_children_resolved in
-- job_parents.sql) take those batches' and children's rows one by one, in the order of
-- its own rows: two statements on two connections (two daemons' completion flushes)
-- could take them in opposite orders and deadlock. So a BEFORE trigger notes, per row,
-- the batch or the parent whose end it will count (statement_locks), and the first AFTER
-- trigger of the statement takes every noted batch's row, then every waiting child's, in
-- id order, before it counts anything (statement_locks_take): the rest follow without
-- waiting. Only members and parents pay, and only when their status enters or leaves a
-- final one; a note lives for the one statement that wrote it.
CREATE TABLE @schema@.statement_locks (
    xact_id xid8 NOT NULL DEFAULT pg_current_xact_id(),
    -- 'batch': lock batch `target`; 'children': lock parent `target`'s waiting children
    kind    text NOT NULL CONSTRAINT statement_locks_kind_known
                 CHECK (kind IN ('batch', 'children')),
    target  bigint NOT NULL
);

CREATE INDEX statement_locks_xact_idx ON @schema@.statement_locks (xact_id);

CREATE FUNCTION @schema@.statement_locks_note()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NEW.batch_id IS NOT NULL THEN
        INSERT INTO @schema@.statement_locks (kind, target) VALUES ('batch', NEW.batch_id);
    END IF;
    IF NEW.has_children THEN
        INSERT INTO @schema@.statement_locks (kind, target) VALUES ('children', NEW.id);
    END IF;
    -- (statement_locks_take looks in the table only while this says so)
    PERFORM pg_catalog.set_config('pgworkerd.statement_locks_' || md5(@schema_literal@),
                                  'noted', true);
    RETURN NEW;
END;
$$;

-- The WHEN of the AFTER triggers below, narrowed to what they count: a final status
-- entered or left.
CREATE TRIGGER jobs_statement_locks_noted
    BEFORE UPDATE OF status ON @schema@.jobs
    FOR EACH ROW
    WHEN ((NEW.batch_id IS NOT NULL OR NEW.has_children)
          AND OLD.status IS DISTINCT FROM NEW.status
          AND (OLD.status IN ('completed', 'dead', 'cancelled')
               OR NEW.status IN ('completed', 'dead', 'cancelled')))
    EXECUTE FUNCTION @schema@.statement_locks_note();

-- Take the rows noted so far in this transaction (and forget the notes): the batches in
-- id order, then the parents' waiting children in id order. Called first by the AFTER
-- triggers that count; a call with nothing noted since the last one reads a setting of
-- the transaction and nothing else (the notes' deleted index entries stay until the
-- transaction ends: probing them at each row would cost the statement its rows squared).
CREATE FUNCTION @schema@.statement_locks_take()
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    flag text := 'pgworkerd.statement_locks_' || md5(@schema_literal@);
    batch_ids bigint[];
    parent_ids bigint[];
BEGIN
    IF current_setting(flag, true) IS DISTINCT FROM 'noted' THEN
        RETURN;
    END IF;
    PERFORM pg_catalog.set_config(flag, '', true);
    WITH noted AS (
        DELETE FROM @schema@.statement_locks l WHERE l.xact_id = pg_current_xact_id()
        RETURNING l.kind, l.target
    )
    SELECT array_agg(DISTINCT n.target) FILTER (WHERE n.kind = 'batch'),
           array_agg(DISTINCT n.target) FILTER (WHERE n.kind = 'children')
      INTO batch_ids, parent_ids
      FROM noted n;
    IF batch_ids IS NOT NULL THEN
        PERFORM FROM @schema@.batches b WHERE b.id = ANY (batch_ids) ORDER BY b.id FOR UPDATE;
    END IF;
    IF parent_ids IS NOT NULL THEN
        PERFORM FROM @schema@.jobs c
         WHERE c.id IN (SELECT p.child_id FROM @schema@.job_parents p
                         WHERE p.parent_id = ANY (parent_ids))
           AND c.status = 'waiting'
         ORDER BY c.id
           FOR UPDATE;
    END IF;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.statement_locks_note(), @schema@.statement_locks_take()
    FROM PUBLIC;

-- A member's status changed to or from a final one: update its batch's counts, and when
-- the last member has finished, make the callback pending and wake the fleet (the
-- notification an insert sends). Concurrent members of one batch serialise on the batch's
-- row (the UPDATE below) for as long as their transactions last, so each count is exact
-- whatever order they commit in, and exactly one of them sees the last finish; a
-- statement takes all its batches' rows first, in id order (statement_locks_take). A member
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
    PERFORM @schema@.statement_locks_take();  -- the statement's rows, in id order (0032)
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
            PERFORM @schema@.workers_wake(released.queue, released.handler, released.id, 1,
                                          0, 0);
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

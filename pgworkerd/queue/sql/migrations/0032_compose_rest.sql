-- Issue 24, the rest (docs/guide/waits.md, batches.md, dependencies.md): a signal sent by
-- correlation key before any job waits with that key is parked (parked_signals,
-- signal_send_by_key_v2) and handed over by the WaitFor (job_suspend); the daemons' sweep
-- deletes parked signals past their 7 days (job_waits_expire). A statement that finishes
-- members of several batches or parents of several children takes their rows in id order
-- first (statement_locks; no deadlock between two daemons' completions). The daemons end
-- jobs past their expires_at without a claim (job_expired_cancel).
-- compatible-with-code-of-schema: 5
--
-- An expand migration: it adds two tables, their indexes, functions and a BEFORE trigger
-- whose WHEN is false for every job that is neither a batch member nor a parent, and
-- replaces job_suspend, job_waits_expire, batch_member_count and job_children_resolve
-- with bodies of the same signatures and results that also hand over or delete parked
-- signals (none exist before new code parks one) or take their locks in id order first.
-- signal_send_by_key keeps its text (compat.sql) for older code, which keeps refusing a
-- signal by key no live job holds. The declaration is objects/signals.sql (and
-- finish.sql, compat.sql, batches.sql, job_parents.sql, retention.sql); this is the same
-- text.

-- Signals parked under a correlation key (signals.sql).
CREATE TABLE @schema@.parked_signals (
    -- the login that sent it (session_user: signal_send_by_key_v2 is SECURITY DEFINER); a
    -- parked signal reaches only a job this login may read (job_get_v1's rule), so one
    -- application cannot inject a signal into another's job by guessing its key
    sent_by       text NOT NULL DEFAULT session_user,
    wait_key      text NOT NULL,
    name          text NOT NULL,
    payload       jsonb,
    payload_bytes integer NOT NULL,
    sent_at       timestamptz NOT NULL DEFAULT now(),
    -- first write wins, per sender: a second signal of the name under the key is ignored
    PRIMARY KEY (sent_by, wait_key, name),
    CONSTRAINT parked_signals_name_ok CHECK (@schema@.enqueue_name_ok(name) AND name <> ''),
    CONSTRAINT parked_signals_key_ok CHECK (@schema@.enqueue_name_ok(wait_key)
                                            AND wait_key <> '')
);

-- job_suspend looks a key's parked signals up by key, whoever sent them.
CREATE INDEX parked_signals_key_idx ON @schema@.parked_signals (wait_key);

-- The sweep deletes those past PARKED_DAYS, oldest first.
CREATE INDEX parked_signals_sent_at_idx ON @schema@.parked_signals (sent_at);

-- Signal by key, parked when no live job holds the key (signals.sql).
CREATE FUNCTION @schema@.signal_send_by_key_v2(wait_key text, name text,
                                               payload jsonb DEFAULT NULL)
RETURNS TABLE (job_id bigint, outcome text, status text, sent_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    found_id bigint;
    first_sent timestamptz;
    bytes integer;
    held record;
    problem text;
BEGIN
    IF signal_send_by_key_v2.wait_key IS NULL
       OR NOT @schema@.enqueue_name_ok(signal_send_by_key_v2.wait_key)
       OR signal_send_by_key_v2.wait_key = '' THEN
        RAISE EXCEPTION 'pgworkerd: signal refused: a correlation key must be 1 to 128 '
            'characters without control characters, not %',
            coalesce(pg_catalog.quote_literal(left(signal_send_by_key_v2.wait_key, 200)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext(@schema_literal@ || '.wait_key'),
                                  hashtext(signal_send_by_key_v2.wait_key));
    -- (a statement after the lock: it sees a WaitFor with this key committed before it)
    SELECT j.id INTO found_id FROM @schema@.jobs j
     WHERE j.wait_key = signal_send_by_key_v2.wait_key
       AND j.status IN ('pending', 'waiting', 'suspended', 'running')
       AND (j.enqueued_by = session_user
            OR has_any_column_privilege(session_user, '@schema@.jobs', 'SELECT'));
    IF found_id IS NOT NULL THEN
        RETURN QUERY
        SELECT found_id, s.outcome, s.status, s.sent_at
          FROM @schema@.signal_send(found_id, signal_send_by_key_v2.name,
                                    signal_send_by_key_v2.payload) s;
        RETURN;
    END IF;
    -- No job of ours holds the key: park it. signal_send's checks of name and payload
    -- first, with its words.
    problem := CASE
        WHEN signal_send_by_key_v2.name IS NULL
             OR NOT @schema@.enqueue_name_ok(signal_send_by_key_v2.name)
             OR signal_send_by_key_v2.name = '' THEN
            'a signal name must be 1 to 128 characters without control characters, not '
            'beginning or ending with a space (like a handler''s name), not '
            || coalesce(pg_catalog.quote_literal(left(signal_send_by_key_v2.name, 200)), 'NULL')
        WHEN jsonb_path_exists(signal_send_by_key_v2.payload, 'strict $.**{256 to last}') THEN
            'a signal payload must be nested at most 255 levels deep'
    END;
    bytes := coalesce(pg_column_size(signal_send_by_key_v2.payload), 0);
    IF problem IS NULL THEN
        SELECT p.sent_at INTO first_sent FROM @schema@.parked_signals p
         WHERE p.sent_by = session_user AND p.wait_key = signal_send_by_key_v2.wait_key
           AND p.name = signal_send_by_key_v2.name
           AND p.sent_at > now() - interval '7 days';
        IF FOUND THEN
            RETURN QUERY SELECT NULL::bigint, 'ignored'::text, NULL::text, first_sent;
            RETURN;
        END IF;
        -- this login's parked signals past their 7 days go first (the sweep would)
        DELETE FROM @schema@.parked_signals p
         WHERE p.sent_by = session_user AND p.sent_at <= now() - interval '7 days';
        SELECT count(*) FILTER (WHERE p.wait_key = signal_send_by_key_v2.wait_key) AS key_names,
               coalesce(sum(p.payload_bytes) FILTER (
                   WHERE p.wait_key = signal_send_by_key_v2.wait_key), 0) AS key_bytes,
               count(*) AS all_signals, coalesce(sum(p.payload_bytes), 0) AS all_bytes
          INTO held
          FROM @schema@.parked_signals p WHERE p.sent_by = session_user;
        problem := CASE
            WHEN held.key_names >= 16 THEN
                'no live job holds correlation key '
                || pg_catalog.quote_literal(signal_send_by_key_v2.wait_key)
                || ' and 16 signals are parked under it already (at most 16 names per key)'
            WHEN held.key_bytes + bytes > 1024 * 1024 THEN
                'no live job holds correlation key '
                || pg_catalog.quote_literal(signal_send_by_key_v2.wait_key)
                || ' and the payloads parked under it would come to ' || held.key_bytes + bytes
                || ' bytes (at most 1 MiB per key)'
            WHEN held.all_signals >= 10000 THEN
                'this login has 10000 signals parked under keys no live job holds (at most '
                || '10000; they are kept 7 days)'
            WHEN held.all_bytes + bytes > 64 * 1024 * 1024 THEN
                'the payloads this login has parked would come to ' || held.all_bytes + bytes
                || ' bytes (at most 64 MiB; they are kept 7 days)'
        END;
    END IF;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgworkerd: signal refused: %', problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    -- (no conflict: the key's lock is held, and this login's rows past their days are gone)
    INSERT INTO @schema@.parked_signals (wait_key, name, payload, payload_bytes)
    VALUES (signal_send_by_key_v2.wait_key, signal_send_by_key_v2.name,
            signal_send_by_key_v2.payload, bytes);
    RETURN QUERY SELECT NULL::bigint, 'parked'::text, NULL::text, now();
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.signal_send_by_key_v2(text, text, jsonb) FROM PUBLIC;

-- A WaitFor with a key takes the signals parked under it (finish.sql).
CREATE OR REPLACE FUNCTION @schema@.job_suspend(
    job_id bigint, worker text, token bigint, signal_name text, timeout_seconds float8,
    wait_key text DEFAULT NULL, progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS TABLE (status text, wait_until timestamptz, problem text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text := @schema@.fenced_job_problem(job_suspend.worker, job_suspend.job_id,
                                                job_suspend.token);
    held record;
    holder bigint;
    signalled boolean;
    suspended record;
BEGIN
    IF problem IS NULL AND (job_suspend.signal_name IS NULL
                            OR NOT @schema@.enqueue_name_ok(job_suspend.signal_name)) THEN
        problem := 'signal_name must be 1 to 128 characters without control characters, '
                   || 'not beginning or ending with a space (like a handler''s name), not '
                   || coalesce(pg_catalog.quote_literal(left(job_suspend.signal_name, 200)),
                               'NULL');
    END IF;
    -- (NaN is above every number in PostgreSQL: refused too)
    IF problem IS NULL
       AND (job_suspend.timeout_seconds > 0
            AND job_suspend.timeout_seconds <= 31622400) IS NOT TRUE THEN
        problem := 'timeout_seconds must be above 0 and at most 31622400 (366 days), not '
                   || coalesce(job_suspend.timeout_seconds::text, 'NULL');
    END IF;
    IF problem IS NULL AND job_suspend.wait_key IS NOT NULL
       AND NOT @schema@.enqueue_name_ok(job_suspend.wait_key) THEN
        problem := 'wait_key must be NULL or 1 to 128 characters without control '
                   || 'characters, not ' || pg_catalog.quote_literal(left(job_suspend.wait_key, 200));
    END IF;
    IF problem IS NOT NULL THEN
        PERFORM @schema@.fenced_refuse('suspending a job', problem);
    END IF;
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    IF job_suspend.wait_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtext(@schema_literal@ || '.wait_key'),
                                      hashtext(job_suspend.wait_key));
    END IF;
    SELECT j.id, j.enqueued_by INTO held FROM @schema@.jobs j
     WHERE j.id = job_suspend.job_id AND j.locked_by = job_suspend.worker
       AND j.lease_token = job_suspend.token AND j.status::text = 'running'
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;  -- the lease was lost: nothing changed
    END IF;
    IF job_suspend.wait_key IS NOT NULL THEN
        SELECT j.id INTO holder FROM @schema@.jobs j
         WHERE j.wait_key = job_suspend.wait_key AND j.id <> job_suspend.job_id
           AND j.status IN ('pending', 'waiting', 'suspended', 'running');
        IF holder IS NOT NULL THEN
            RETURN QUERY SELECT 'refused'::text, NULL::timestamptz,
                'WaitFor: correlation key ' || pg_catalog.quote_literal(job_suspend.wait_key)
                || ' is held by live job ' || holder || ' (a key names one live job)';
            RETURN;
        END IF;
    END IF;
    BEGIN
        IF job_suspend.wait_key IS NOT NULL THEN
            -- signals parked under the key by a login that may read this job, the first
            -- of each name, become the job's
            WITH adopted AS (
                DELETE FROM @schema@.parked_signals p
                 WHERE p.wait_key = job_suspend.wait_key
                   AND p.sent_at > now() - interval '7 days'
                   AND (p.sent_by = held.enqueued_by
                        OR CASE WHEN EXISTS (SELECT FROM pg_roles r WHERE r.rolname = p.sent_by)
                                THEN has_any_column_privilege(p.sent_by, '@schema@.jobs',
                                                              'SELECT')
                                ELSE false END)
                RETURNING p.name, p.payload, p.sent_at, p.sent_by
            )
            INSERT INTO @schema@.signals AS s (job_id, name, payload, sent_at, sent_by)
            SELECT DISTINCT ON (a.name) job_suspend.job_id, a.name, a.payload, a.sent_at,
                   a.sent_by
              FROM adopted a
             ORDER BY a.name, a.sent_at
            ON CONFLICT ON CONSTRAINT signals_pkey DO NOTHING;
        END IF;
        -- (a statement after the locks: it sees every signal committed before they came)
        signalled := EXISTS (SELECT FROM @schema@.signals s
                              WHERE s.job_id = job_suspend.job_id
                                AND s.name = job_suspend.signal_name);
        UPDATE @schema@.jobs j
           SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                             WHEN signalled THEN 'pending'
                             ELSE 'suspended' END::@schema@.job_status,
               finished_at = CASE WHEN j.cancel_requested THEN now() END,
               run_at = CASE WHEN signalled AND NOT j.cancel_requested THEN now()
                             ELSE j.run_at END,
               attempts = j.attempts - 1,
               wait_for = job_suspend.signal_name,
               wait_since = now(),
               wait_until = now() + make_interval(secs => job_suspend.timeout_seconds),
               wait_key = job_suspend.wait_key,
               wait_ended = CASE WHEN signalled THEN 'signal' END,
               progress = coalesce(job_suspend.progress, j.progress),
               checkpoint = coalesce(job_suspend.checkpoint, j.checkpoint),
               locked_by = NULL, locked_until = NULL, cancel_requested = false,
               updated_at = now()
         WHERE j.id = job_suspend.job_id
        RETURNING j.status::text AS status, j.wait_until, j.queue, j.handler INTO suspended;
    EXCEPTION WHEN unique_violation THEN
        -- another job took the key since the look above (jobs_wait_key_live_idx)
        RETURN QUERY SELECT 'refused'::text, NULL::timestamptz,
            'WaitFor: correlation key ' || pg_catalog.quote_literal(job_suspend.wait_key)
            || ' is held by another live job (a key names one live job)';
        RETURN;
    END;
    IF suspended.status = 'pending' THEN
        PERFORM pg_notify(@schema_literal@ || '.wake',
            CASE WHEN octet_length(suspended.queue) + octet_length(suspended.handler) <= 2048
                 THEN json_build_object('q', suspended.queue, 'h', suspended.handler,
                                        'id', job_suspend.job_id, 'n', 1)
                 ELSE json_build_object('id', job_suspend.job_id, 'n', 1) END::text);
    END IF;
    RETURN QUERY SELECT suspended.status, suspended.wait_until, NULL::text;
END;
$$;

-- The timeout sweep also deletes parked signals past their 7 days (signals.sql).
CREATE OR REPLACE FUNCTION @schema@.job_waits_expire(max_jobs integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    moved integer;
BEGIN
    IF (job_waits_expire.max_jobs BETWEEN 1 AND 100000) IS NOT TRUE THEN
        PERFORM @schema@.fenced_refuse('expiring waits',
            'max_jobs must be from 1 to 100000, not '
            || coalesce(job_waits_expire.max_jobs::text, 'NULL'));
    END IF;
    WITH due AS (
        SELECT j.id FROM @schema@.jobs j
         WHERE j.status = 'suspended' AND j.wait_until <= now()
         ORDER BY j.wait_until
         LIMIT job_waits_expire.max_jobs
           FOR UPDATE SKIP LOCKED
    ), woken AS (
        UPDATE @schema@.jobs j
           SET status = 'pending', wait_ended = 'timeout', run_at = now(), updated_at = now()
          FROM due d
         WHERE j.id = d.id AND j.status = 'suspended'
        RETURNING j.id, j.queue, j.handler
    ), told AS (
        -- one wake-up per queue and handler, as notify_wake sends for an insert
        SELECT pg_notify(@schema_literal@ || '.wake',
                   CASE WHEN octet_length(w.queue) + octet_length(w.handler) <= 2048
                        THEN json_build_object('q', w.queue, 'h', w.handler,
                                               'id', min(w.id), 'n', count(*))
                        ELSE json_build_object('id', min(w.id), 'n', count(*)) END::text)
          FROM woken w
         GROUP BY w.queue, w.handler
    )
    SELECT (SELECT count(*) FROM woken) + 0 * (SELECT count(*) FROM told) INTO moved;
    -- and signals parked under a key for their 7 days (0032), as many at most
    DELETE FROM @schema@.parked_signals p
     WHERE p.ctid = ANY (ARRAY(SELECT o.ctid FROM @schema@.parked_signals o
                                WHERE o.sent_at <= now() - interval '7 days'
                                ORDER BY o.sent_at
                                LIMIT job_waits_expire.max_jobs));
    RETURN moved;
END;
$$;

-- Lock order of the counting triggers (batches.sql, job_parents.sql).
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

CREATE OR REPLACE FUNCTION @schema@.batch_member_count()
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
            PERFORM pg_notify(@schema_literal@ || '.wake',
                              json_build_object('q', released.queue, 'h', released.handler,
                                                'id', released.id, 'n', 1)::text);
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION @schema@.job_children_resolve()
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
      FROM (SELECT pg_notify(@schema_literal@ || '.wake',
                             json_build_object('q', ch.queue, 'h', ch.handler,
                                               'id', min(ch.id), 'n', count(*))::text)
              FROM changed ch
             WHERE ch.status = 'pending'
             GROUP BY ch.queue, ch.handler) AS sent;
    RETURN NULL;
END;
$$;

-- The fleet's expiry sweep (retention.sql).
CREATE FUNCTION @schema@.job_expired_cancel(max_jobs integer)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    pending_ended integer;
    running_ended integer;
BEGIN
    IF (job_expired_cancel.max_jobs BETWEEN 1 AND 100000) IS NOT TRUE THEN
        PERFORM @schema@.fenced_refuse('ending expired jobs',
            'max_jobs must be from 1 to 100000, not '
            || coalesce(job_expired_cancel.max_jobs::text, 'NULL'));
    END IF;
    UPDATE @schema@.jobs j
       SET status = 'cancelled', finished_at = now(), updated_at = now(),
           last_error = 'expired: not started by its expires_at ' || j.expires_at
      FROM (SELECT e.id FROM @schema@.jobs e
             WHERE e.status = 'pending' AND e.expires_at <= now()
             ORDER BY e.expires_at
             LIMIT job_expired_cancel.max_jobs
               FOR UPDATE SKIP LOCKED) AS expired
     WHERE j.id = expired.id;
    GET DIAGNOSTICS pending_ended = ROW_COUNT;
    UPDATE @schema@.jobs j
       SET status = 'cancelled', finished_at = now(), updated_at = now(),
           locked_by = NULL, locked_until = NULL,
           last_error = 'expired: its lease ran out after its expires_at ' || j.expires_at
                        || '; not started again'
      FROM (SELECT e.id FROM @schema@.jobs e
             WHERE e.status = 'running' AND e.locked_until < now()
               AND e.expires_at <= now()
             ORDER BY e.locked_until
             LIMIT job_expired_cancel.max_jobs
               FOR UPDATE SKIP LOCKED) AS expired
     WHERE j.id = expired.id;
    GET DIAGNOSTICS running_ended = ROW_COUNT;
    RETURN pending_ended + running_ended;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.job_expired_cancel(integer) FROM PUBLIC;

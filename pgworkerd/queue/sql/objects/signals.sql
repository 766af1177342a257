-- Durable waits and signals (0028): a handler suspends its job until a named signal or a
-- timeout (raise pgworkerd.WaitFor; the fenced transition job_suspend in finish.sql);
-- signal_send and signal_send_by_key deliver a signal; job_waits_expire, run by the
-- daemons on a cadence, moves suspended jobs past their timeout back to pending.
-- The wait itself is in columns of jobs (wait_for, wait_since, wait_until, wait_key,
-- wait_ended); the signals a job received are rows here.

-- One row per signal a job received, by name: the first write wins (a second signal of
-- the same name is reported as ignored and changes nothing), and a signal sent before the
-- job waits for it is kept here until it does. Removed with its job by the triggers
-- below (not a foreign key, as for attempts: TRUNCATE of jobs keeps working, and a
-- finish does not pay for a key check).
CREATE TABLE @schema@.signals (
    job_id   bigint NOT NULL,
    name     text NOT NULL,
    payload  jsonb,
    sent_at  timestamptz NOT NULL DEFAULT now(),
    -- the login that sent it (session_user: signal_send is SECURITY DEFINER)
    sent_by  text NOT NULL DEFAULT session_user,
    PRIMARY KEY (job_id, name),
    CONSTRAINT signals_name_ok CHECK (@schema@.enqueue_name_ok(name))
);

-- Deleted jobs (`pgworkerd prune`, retention, any DELETE or TRUNCATE by whatever role)
-- take their signals along: one statement per DELETE, however many jobs it removed.
CREATE FUNCTION @schema@.signals_forget()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        TRUNCATE @schema@.signals;
    ELSE
        DELETE FROM @schema@.signals s USING gone g WHERE s.job_id = g.id;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_signals_forget
    AFTER DELETE ON @schema@.jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.signals_forget();

CREATE TRIGGER jobs_signals_forget_all
    AFTER TRUNCATE ON @schema@.jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.signals_forget();

REVOKE EXECUTE ON FUNCTION @schema@.signals_forget() FROM PUBLIC;

-- Send signal `name` (a name like a handler's: enqueue_name_ok) with `payload` (any JSON
-- value or NULL; at most 64 MiB and nested at most 255 levels deep, enqueue's payload
-- bounds; jsonb itself refuses a NUL) to job `job_id`. Returns what became of it:
--   resumed  the job was suspended waiting for this name: pending now, its fleet woken;
--   kept     the job is live but not waiting for it (yet): the signal is kept, and the
--            job's next WaitFor for this name returns at once;
--   ignored  the job already has a signal of this name: first write wins, nothing changed
--            (sent_at says when the first came);
-- with the job's status after it. Refused (22023, nothing changed): an unknown job (or
-- one this login may not read: job_get_v1's rule, so it learns nothing of other
-- applications' jobs), a finished job, a bad name, a payload over the bounds.
-- SECURITY DEFINER: the enqueuer writes neither jobs nor signals itself. The job's row is
-- locked first, so a signal and job_suspend of the same job happen one after the other,
-- never interleaved: a signal is never lost between a wait's check and its suspension.
CREATE FUNCTION @schema@.signal_send(job_id bigint, name text, payload jsonb DEFAULT NULL)
RETURNS TABLE (outcome text, status text, sent_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    job record;
    first_sent timestamptz;
    problem text;
BEGIN
    problem := CASE
        WHEN signal_send.job_id IS NULL THEN 'job_id must be a job id, not NULL'
        WHEN signal_send.name IS NULL OR NOT @schema@.enqueue_name_ok(signal_send.name)
             OR signal_send.name = '' THEN
            'a signal name must be 1 to 128 characters without control characters, not '
            'beginning or ending with a space (like a handler''s name), not '
            || coalesce(pg_catalog.quote_literal(left(signal_send.name, 200)), 'NULL')
        WHEN pg_column_size(signal_send.payload || '[]'::jsonb) > 64 * 1024 * 1024 THEN
            'a signal payload must be at most 64 MiB, not '
            || pg_column_size(signal_send.payload || '[]'::jsonb) || ' bytes'
        WHEN jsonb_path_exists(signal_send.payload, 'strict $.**{256 to last}') THEN
            'a signal payload must be nested at most 255 levels deep'
    END;
    IF problem IS NULL THEN
        SELECT j.id, j.status::text AS status, j.wait_for INTO job
          FROM @schema@.jobs j
         WHERE j.id = signal_send.job_id
           AND (j.enqueued_by = session_user
                OR has_any_column_privilege(session_user, '@schema@.jobs', 'SELECT'))
           FOR UPDATE;
        IF NOT FOUND THEN
            problem := 'no job ' || signal_send.job_id || ' (or not one this login may read)';
        ELSIF job.status IN ('completed', 'dead', 'cancelled') THEN
            problem := 'job ' || signal_send.job_id || ' is ' || job.status
                       || ': a finished job takes no signal';
        END IF;
    END IF;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgworkerd: signal refused: %', problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    INSERT INTO @schema@.signals AS s (job_id, name, payload)
    VALUES (signal_send.job_id, signal_send.name, signal_send.payload)
    ON CONFLICT ON CONSTRAINT signals_pkey DO NOTHING;
    IF NOT FOUND THEN
        SELECT s.sent_at INTO first_sent FROM @schema@.signals s
         WHERE s.job_id = signal_send.job_id AND s.name = signal_send.name;
        RETURN QUERY SELECT 'ignored'::text, job.status, first_sent;
        RETURN;
    END IF;
    IF job.status = 'suspended' AND job.wait_for = signal_send.name THEN
        UPDATE @schema@.jobs j
           SET status = 'pending', wait_ended = 'signal', run_at = now(), updated_at = now()
         WHERE j.id = signal_send.job_id
        RETURNING j.queue, j.handler INTO job;
        PERFORM @schema@.workers_wake(job.queue, job.handler, signal_send.job_id, 1, 0, 0);
        RETURN QUERY SELECT 'resumed'::text, 'pending'::text, now();
        RETURN;
    END IF;
    RETURN QUERY SELECT 'kept'::text, job.status, now();
END;
$$;

-- Signals sent by correlation key before any job waits with that key (0032): kept here,
-- under the key and the login that sent them, until a job of a login they may reach
-- waits with the key (job_suspend hands them to it) or for PARKED_DAYS (7 days: deleted
-- by the daemons' timeout sweep, job_waits_expire, and ignored by job_suspend meanwhile).
-- Bounded against a sender that parks without end: at most 16 names and 1 MiB of
-- payloads per sender and key, at most 10,000 signals and 64 MiB per sender
-- (signal_send_by_key_v2 refuses more). Not tied to any job: no job exists for them yet.
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

-- signal_send to the live job whose wait holds correlation key `wait_key` (WaitFor(...,
-- key=...)), for a sender that knows the key and not the id (a webhook). Returns
-- signal_send's row and the job's id; when no live job this login may read holds the key
-- (the job has not reached its WaitFor yet, or is another application's), the signal is
-- parked under the key instead (outcome 'parked', job_id and status NULL): the next job
-- of a login it may reach that waits with the key receives it, as if sent to it then.
-- A second signal of the same name under the same key by the same login while the
-- first is parked: 'ignored' (first write wins; sent_at is the first one's).
-- Refused (22023, nothing changed): a bad key, name or payload (signal_send's bounds),
-- or a parked signal over its bounds (see parked_signals).
-- A signal by key and a WaitFor with that key (job_suspend) take the same transaction
-- lock on the key first, so one always sees the other's commit: the signal reaches the
-- job, or is parked and handed over by the WaitFor, never neither.
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

REVOKE EXECUTE ON FUNCTION
    @schema@.signal_send(bigint, text, jsonb),
    @schema@.signal_send_by_key_v2(text, text, jsonb)
    FROM PUBLIC;

-- The daemons' timeout sweep (daemon/waits.py, on a cadence): suspended jobs past their
-- wait_until become pending at once (wait_ended 'timeout': their next attempt sees no
-- signal), at most `max_jobs` per call, rows another transaction holds (a signal landing
-- now) skipped; the peers that serve them are woken as for a new job. Returns how many.
-- It also deletes up to `max_jobs` signals parked under a key past their 7 days (0032).
-- SECURITY DEFINER: the daemon role has no UPDATE on jobs.
CREATE FUNCTION @schema@.job_waits_expire(max_jobs integer DEFAULT 1000)
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
        SELECT @schema@.workers_wake(w.queue, w.handler, min(w.id), count(*), 0, 0)
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

REVOKE EXECUTE ON FUNCTION @schema@.job_waits_expire(integer) FROM PUBLIC;

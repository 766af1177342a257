-- Wake-ups aimed at daemons (issue 26, item 6): jobs that become due wake the daemons
-- chosen for them on their own channels, not every daemon of the fleet.
-- compatible-with-code-of-schema: 5
--
-- An expand migration: a new column of the registry (workers.wake_channel, NULL for every
-- row until its daemon says it listens there) and new functions (workers_wake and the
-- channel's), and every function that sent a wake-up for due jobs on the fleet's channel
-- now calls workers_wake (the same wake-ups, to the daemons chosen for them): notify_wake
-- (SECURITY DEFINER now: it reads the registry through workers_wake), release_job,
-- job_suspend, signal_send, job_waits_expire, job_children_resolve, job_held_release and
-- batch_member_count, replaced with the same text but that call. Older daemons run on:
-- their rows have no channel, so a wake-up whose group holds one of them goes to the
-- fleet's channel as before, and they rank it as before. The declarations are
-- objects/workers.sql, jobs.sql, finish.sql, signals.sql, job_parents.sql and
-- batches.sql; this is the same text.

ALTER TABLE @schema@.workers ADD COLUMN wake_channel text
    CONSTRAINT workers_wake_channel_check CHECK (octet_length(wake_channel) <= 63);

-- Wake-ups aimed at daemons (0040).
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- The channel of a daemon's own wake-ups: short whatever the schema's name (a channel name
-- is at most 63 bytes) and distinct per schema and daemon. Channels are per database.
CREATE FUNCTION @schema@.worker_wake_channel_name(worker text)
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
RETURN 'pgworkerd.w.' || left(md5(@schema_literal@ || ':' || worker), 24);

-- LISTEN on the caller's own channel (a daemon's LISTEN connection, before it says so in
-- its row with worker_wake_channel_set); returns the channel. LISTEN needs no right: any
-- role may listen anywhere, as any may NOTIFY.
CREATE FUNCTION @schema@.worker_wake_listen(worker text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    channel text := @schema@.worker_wake_channel_name(worker);
BEGIN
    EXECUTE format('LISTEN %I', channel);
    RETURN channel;
END;
$$;

-- Whether the caller's own row says it listens on its channel (the secret names the row,
-- as every write of it); false when there is no such row (register first).
CREATE FUNCTION @schema@.worker_wake_channel_set(id text, secret text, listening boolean)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    UPDATE @schema@.workers w
       SET wake_channel = CASE WHEN worker_wake_channel_set.listening
                               THEN @schema@.worker_wake_channel_name(w.id) END
     WHERE w.id = worker_wake_channel_set.id AND w.state <> 'gone'
       AND w.secret_sha256 = @schema@.worker_secret_digest(worker_wake_channel_set.secret);
    RETURN FOUND;
END;
$$;

-- Whose wake-up `n` new jobs of (queue, handler) are, the lowest of them `job_id`: a group
-- of the running daemons that serve both, are not draining and keep to their heartbeat
-- (not daemon_silent), ranked by the highest hash of each daemon's id seeded with the job
-- id (rendezvous hashing: an even share each; a daemon coming or going moves only its own
-- share), from the `skip`-th on, as many as hold the n jobs by their slots. Each is
-- notified on its own channel, so that one enqueue wakes one daemon process, not the
-- fleet (PostgreSQL 15 still signals every listening backend of the database, which reads
-- the notification and passes it over: see docs/design/daemon.md, "Wake-ups"). A group with a
-- daemon that has no channel (older, or not listening now), or no daemon at all for the
-- first group, and the notification also goes to the fleet's channel as before: every
-- daemon ranks it on its own ring (daemon/peers.py); a wake-up may be taken twice, never
-- dropped. A wake-up handed on past the last daemon goes nowhere: the last ones keep it.
-- The payload on a daemon's channel: {"q", "h", "id", "n", "skip", "next": where the next
-- group starts, "hops"}; on the fleet's: {"q", "h", "id", "n"} (with "skip" and "hops"
-- when handed on), as before 0040.
-- Called wherever jobs become due: the trigger of new jobs (notify_wake), a release
-- (release_job), a wait that ends (job_suspend, signal_send, job_waits_expire), parents
-- that finished (job_children_resolve, job_held_release), a batch's callback
-- (batch_member_count); and by daemons handing on a wake-up they cannot take (skip = next,
-- hops + 1). Names longer than enqueue allows (a direct INSERT) are left out of the
-- payload, which goes to the fleet's channel. Returns the daemons notified on their own
-- channel.
CREATE FUNCTION @schema@.workers_wake(queue text, handler text, job_id bigint, n bigint,
                                     skip integer, hops integer)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    daemon record;
    held bigint := 0;
    size integer := 0;
    channels text[] := '{}';
    fleet boolean := false;
    body text;
BEGIN
    IF queue IS NULL OR handler IS NULL OR job_id IS NULL OR n IS NULL OR n < 1
       OR skip IS NULL OR skip < 0 OR hops IS NULL OR hops < 0 THEN
        RAISE EXCEPTION 'pgworkerd: workers_wake needs a queue, a handler, a job id, n >= 1, '
                        'skip >= 0 and hops >= 0'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(queue) + octet_length(handler) > 2048 THEN
        -- names longer than enqueue allows (a direct INSERT): left out of the payload
        -- rather than failing on NOTIFY's 8,000-byte limit; a wake-up for every handler
        PERFORM pg_notify(@schema_literal@ || '.wake',
                          json_build_object('id', job_id, 'n', n)::text);
        RETURN 0;
    END IF;
    FOR daemon IN
        SELECT w.wake_channel, greatest(w.slots, 1) AS slots
          FROM @schema@.workers w
         WHERE w.state = 'running' AND NOT w.drain_requested
           AND NOT @schema@.daemon_silent(w)
           AND w.heartbeat_at <= now() + interval '5 seconds'
           AND workers_wake.queue = ANY (w.queues) AND workers_wake.handler = ANY (w.handlers)
         ORDER BY hashtextextended(w.id, workers_wake.job_id) DESC, w.id
         -- (a daemon holds one job at least: n daemons at most, a top-n sort)
         LIMIT least(n, 5000) OFFSET skip
    LOOP
        EXIT WHEN held >= n;
        held := held + daemon.slots;
        size := size + 1;
        IF daemon.wake_channel IS NULL THEN
            fleet := true;
        ELSE
            channels := channels || daemon.wake_channel;
        END IF;
    END LOOP;
    body := json_build_object('q', queue, 'h', handler, 'id', job_id, 'n', n)::text;
    IF fleet OR (size = 0 AND skip = 0) THEN
        -- as the trigger sent it before 0040 (and a daemon's forward: with skip and hops)
        PERFORM pg_notify(@schema_literal@ || '.wake',
                          CASE WHEN skip = 0 AND hops = 0 THEN body
                          ELSE left(body, -1) || format(', "skip" : %s, "hops" : %s}', skip, hops)
                          END);
    END IF;
    body := left(body, -1) || format(', "skip" : %s, "next" : %s, "hops" : %s}',
                                     skip, skip + size, hops);
    PERFORM pg_notify(c, body) FROM unnest(channels) AS c;
    RETURN cardinality(channels);
END;
$$;

REVOKE EXECUTE ON FUNCTION
    @schema@.worker_wake_channel_set(text, text, boolean),
    @schema@.workers_wake(text, text, bigint, bigint, integer, integer)
    FROM PUBLIC;

CREATE OR REPLACE FUNCTION @schema@.notify_wake()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @schema@.workers_wake(a.queue, a.handler, min(a.id), count(*), 0, 0)
       FROM added a
      GROUP BY a.queue, a.handler;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION @schema@.release_job(
    job_id bigint, worker text, token bigint,
    progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text := @schema@.fenced_job_problem(release_job.worker, release_job.job_id,
                                                release_job.token);
    released record;
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM @schema@.fenced_refuse('releasing a job', problem);
    END IF;
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
    RETURNING j.status::text AS status, j.queue, j.handler INTO released;
    IF released.status = 'pending' THEN
        PERFORM @schema@.workers_wake(released.queue, released.handler, release_job.job_id,
                                      1, 0, 0);
    END IF;
    RETURN released.status;
END;
$$;

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
        PERFORM @schema@.workers_wake(suspended.queue, suspended.handler, job_suspend.job_id,
                                      1, 0, 0);
    END IF;
    RETURN QUERY SELECT suspended.status, suspended.wait_until, NULL::text;
END;
$$;

CREATE OR REPLACE FUNCTION @schema@.signal_send(job_id bigint, name text, payload jsonb DEFAULT NULL)
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
      FROM (SELECT @schema@.workers_wake(ch.queue, ch.handler, min(ch.id), count(*), 0, 0)
              FROM changed ch
             WHERE ch.status = 'pending'
             GROUP BY ch.queue, ch.handler) AS sent;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION @schema@.job_held_release(job_id bigint)
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
            PERFORM @schema@.workers_wake(released.queue, released.handler, released.id, 1,
                                          0, 0);
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

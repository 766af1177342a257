-- Jobs: the queue's one table, its indexes, the triggers on it (and their functions), and
-- job_get_v1, the read of one job for its enqueuer. What enqueues, claims and finishes
-- jobs lives in enqueue.sql, claim.sql and finish.sql.

CREATE TYPE @schema@.job_status AS ENUM (
    'pending', 'waiting', 'suspended', 'running', 'completed', 'dead', 'cancelled'
);

CREATE SEQUENCE @schema@.jobs_id_seq AS bigint;

CREATE TABLE @schema@.jobs (
    id               bigint PRIMARY KEY DEFAULT nextval('@schema@.jobs_id_seq'),
    queue            text NOT NULL DEFAULT 'default',
    handler          text NOT NULL,
    payload          jsonb NOT NULL DEFAULT '{}',
    status           @schema@.job_status NOT NULL DEFAULT 'pending',
    -- Lower runs sooner (like nice(1)): 0 is the default, negative is urgent.
    priority         integer NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    attempts         integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL DEFAULT 5,
    locked_by        text,
    locked_until     timestamptz,
    -- Fencing token: a new one, drawn at random, with every claim (the trigger
    -- jobs_lease_token_drawn); renew and finish must name it.
    lease_token      bigint NOT NULL DEFAULT 0,
    cancel_requested boolean NOT NULL DEFAULT false,
    last_error       text,
    result           jsonb,
    progress         jsonb,
    checkpoint       jsonb,
    dedupe_key       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    -- A job's key within its handler for per-key concurrency limits (claim.sql); NULL: none.
    concurrency_key  text,
    -- Snoozes of the job (pgworkerd.Snooze): each hands its attempt back uncounted, so this
    -- count is what a handler's max_snoozes bounds.
    snoozes          integer NOT NULL DEFAULT 0
                     CONSTRAINT jobs_snoozes_not_negative CHECK (snoozes >= 0),
    -- Who enqueued the job: the login (session_user, not current_user: the enqueue
    -- functions are SECURITY DEFINER), so that an enqueuer, which may not read this table,
    -- reads and waits for its own jobs (job_get_v1) and no one else's. NULL for jobs
    -- enqueued before schema 18 (migration 0018 leaves them so: no enqueuer reads them).
    enqueued_by      text DEFAULT session_user,
    -- Dependencies (0027, job_parents.sql). A job that names parents (enqueue's "after")
    -- counts those not finished yet and those that ended dead or cancelled; NULL for a
    -- job without parents. Its status is 'waiting' until the count reaches 0.
    parents_unfinished integer,
    parents_failed   integer,
    -- What a parent ending dead or cancelled does to this job: 'cancel' it (the default),
    -- 'run' it anyway, or 'hold' it (waiting) for an operator; NULL without parents.
    on_parent_failure text
                     CONSTRAINT jobs_on_parent_failure_known
                     CHECK (on_parent_failure IN ('cancel', 'run', 'hold')),
    -- Some job names this one as a parent: its status changes resolve those children
    -- (trigger jobs_children_resolved). False for every other job, so that finishing a
    -- job without children costs what it did.
    has_children     boolean NOT NULL DEFAULT false,
    -- Deadlines chosen at enqueue (0027): not started after expires_at (NULL: whenever),
    -- and a per-job timeout in seconds that overrides the handler's (NULL: the handler's).
    expires_at       timestamptz,
    timeout_seconds  double precision
                     CONSTRAINT jobs_timeout_seconds_positive
                     CHECK (timeout_seconds > 0 AND timeout_seconds <= 31536000),
    -- Durable waits (0028; signals.sql): the signal name the job waits for while
    -- 'suspended' (raise pgworkerd.WaitFor), and the last one it waited for after that, so
    -- that its next attempts see what woke it; NULL: it never waited.
    wait_for         text,
    wait_since       timestamptz,  -- when the wait began
    wait_until       timestamptz,  -- its timeout: pending again then, without the signal
    -- The correlation key of the wait: `pgworkerd signal --key` finds the job by it (one
    -- live job per key: jobs_wait_key_live_idx).
    wait_key         text,
    -- How the last wait ended: 'signal' or 'timeout'; NULL while it lasts.
    wait_ended       text,
    -- The batch this job is a member of (0030, batches.sql): its final status counts
    -- towards the batch's callback. NULL for every other job (the callback included).
    batch_id         bigint,
    -- Dedupe windows (0034, docs/guide/enqueue.md): the job's dedupe key stays held this
    -- many seconds after it finished (jobs_dedupe_live_idx keeps the row while this is
    -- set). NULL: released when it finishes (or released since: an enqueue of the key, or
    -- retention's sweep, clears it once the window has passed).
    dedupe_window_seconds double precision
                     CONSTRAINT jobs_dedupe_window_seconds_bounded
                     CHECK (dedupe_window_seconds > 0 AND dedupe_window_seconds <= 31536000),
    -- The W3C trace context of the enqueuer (0035, pgworkerd.tracing, docs/operations/
    -- tracing.md): {"traceparent": ..., "tracestate": ...} as the enqueue checked it
    -- (job_trace_problem); each attempt's span links to it. NULL: enqueued outside a trace.
    trace_context    jsonb,
    CONSTRAINT jobs_queue_not_empty CHECK (queue <> ''),
    CONSTRAINT jobs_handler_not_empty CHECK (handler <> ''),
    CONSTRAINT jobs_payload_is_object CHECK (jsonb_typeof(payload) = 'object'),
    CONSTRAINT jobs_attempts_in_range CHECK (attempts >= 0 AND attempts <= max_attempts),
    CONSTRAINT jobs_max_attempts_positive CHECK (max_attempts > 0),
    -- A running job has an owner and a lease; every other status has neither.
    CONSTRAINT jobs_running_has_lease CHECK (
        (status = 'running') = (locked_by IS NOT NULL)
        AND (locked_by IS NULL) = (locked_until IS NULL)),
    CONSTRAINT jobs_running_was_started CHECK (status <> 'running' OR started_at IS NOT NULL),
    -- Finished exactly when the status is final.
    CONSTRAINT jobs_finished_when_final CHECK (
        (status IN ('completed', 'dead', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT jobs_result_only_when_completed CHECK (result IS NULL OR status = 'completed'),
    -- A suspended job names what it waits for and until when, and the wait has not ended.
    CONSTRAINT jobs_suspended_has_wait CHECK (
        status <> 'suspended'
        OR (wait_for IS NOT NULL AND wait_until IS NOT NULL AND wait_ended IS NULL)),
    CONSTRAINT jobs_wait_ended_known CHECK (wait_ended IN ('signal', 'timeout'))
);

ALTER SEQUENCE @schema@.jobs_id_seq OWNED BY @schema@.jobs.id;

-- Indexes.

-- The claim walks this index in ORDER BY order, once per served handler; finished jobs
-- are not in it, so history of any size costs the claim nothing.
CREATE INDEX jobs_pending_order_idx ON @schema@.jobs (handler, priority, run_at, id)
    WHERE status = 'pending';

-- Expired-lease lookup for the claim's rescue branch.
CREATE INDEX jobs_running_lease_idx ON @schema@.jobs (locked_until)
    WHERE status = 'running';

-- Dedupe: one job holds each key of a handler (0004: keys were global, so one client
-- could squat another application's key): a job that has not finished (pending, waiting,
-- suspended or running: 0034, before it only pending and running), or a finished one
-- whose dedupe window has not been released (dedupe_window_seconds). Every enqueue's
-- ON CONFLICT and every look-up of a key's holder spells this predicate out, so that the
-- planner infers this index (and ON CONFLICT clauses of older releases, which say
-- status IN ('pending', 'running'), still imply it).
CREATE UNIQUE INDEX jobs_dedupe_live_idx ON @schema@.jobs (dedupe_key, handler)
    WHERE dedupe_key IS NOT NULL
      AND (status IN ('pending', 'waiting', 'suspended', 'running')
           OR dedupe_window_seconds IS NOT NULL);

-- Finished jobs still holding their dedupe key (0034), by finish time: retention's sweep
-- releases those whose window has passed, oldest first, without reading other jobs.
CREATE INDEX jobs_dedupe_held_idx ON @schema@.jobs (finished_at)
    WHERE finished_at IS NOT NULL AND dedupe_window_seconds IS NOT NULL;

-- Durable waits (0028): the daemons' timeout sweep (job_waits_expire) reads the
-- suspended jobs by timeout, and only them: a job that never waits costs nothing here.
CREATE INDEX jobs_suspended_until_idx ON @schema@.jobs (wait_until)
    WHERE status = 'suspended';

-- A correlation key names one live job (the one `pgworkerd signal --key` reaches): a
-- second live job waiting with the same key is refused (job_suspend).
CREATE UNIQUE INDEX jobs_wait_key_live_idx ON @schema@.jobs (wait_key)
    WHERE wait_key IS NOT NULL
      AND status IN ('pending', 'waiting', 'suspended', 'running');

-- Retention pruning and operators' look-ups of finished jobs.
CREATE INDEX jobs_finished_at_idx ON @schema@.jobs (finished_at)
    WHERE finished_at IS NOT NULL;

-- claim_v3 counts the current leases of each limited handler (and of each of its keys)
-- here: only running jobs are in it, so its size is the fleet's running jobs, never the
-- backlog or the history. locked_until is carried for the lease test.
CREATE INDEX jobs_running_handler_key_idx ON @schema@.jobs (handler, concurrency_key)
    INCLUDE (locked_until)
    WHERE status = 'running';

-- Fair share (0033): claim_v4's round robin steps from one key of a fair handler to the
-- next with pending jobs at a priority (one probe per key: its cost is the keys it
-- visits, never the number of keys) and takes each key's oldest due jobs. Jobs without
-- a key are the key '' (no real key is empty): one more key taking its turn.
CREATE INDEX jobs_pending_fair_idx
    ON @schema@.jobs (handler, priority, (coalesce(concurrency_key, '')), run_at, id)
    WHERE status = 'pending';

-- The jobs page (views.jobs_page): newest first, filtered by status, queue or handler,
-- keyset-paginated by id. Full indexes, not partial: the page lists finished jobs too.
-- The page reads one status at a time (a branch per status), so a queue or handler
-- filter finds each status's newest in id order through (queue, status, id) or
-- (handler, status, id), however rare the combination (a (queue, id) index would read
-- every dead job to find that a queue has none).
-- Each costs one index entry per row version (claim, renewals and finish write new row
-- versions; bottom-up deletion keeps the churn in check), measured in bench/.
CREATE INDEX jobs_status_id_idx ON @schema@.jobs (status, id);

CREATE INDEX jobs_queue_status_id_idx ON @schema@.jobs (queue, status, id);

CREATE INDEX jobs_handler_status_id_idx ON @schema@.jobs (handler, status, id);

-- Finished jobs of each final status by finish time, for retention (0020): with mixed
-- retentions (completed 7 days, dead 30 days) a batch of completed jobs read through
-- jobs_finished_at_idx every kept dead job first, each batch again
-- (bench/retention_cost.py); a partial index per status holds only the rows a batch
-- deletes. (The migrations of these indexes say IF NOT EXISTS, so that an operator can
-- build them beforehand with CREATE INDEX CONCURRENTLY: README "Upgrading".)

CREATE INDEX jobs_completed_finished_at_idx ON @schema@.jobs (finished_at)
    WHERE status = 'completed';

CREATE INDEX jobs_cancelled_finished_at_idx ON @schema@.jobs (finished_at)
    WHERE status = 'cancelled';

CREATE INDEX jobs_dead_finished_at_idx ON @schema@.jobs (finished_at)
    WHERE status = 'dead';

-- Pending jobs with a deadline (0027), for claim_jobs_v2's end of expired jobs: only jobs
-- that have one are in it.
CREATE INDEX jobs_pending_expires_idx ON @schema@.jobs (expires_at)
    WHERE status = 'pending' AND expires_at IS NOT NULL;

-- Triggers, each after its function.

-- NOTIFY '<schema>.finished' (payload: the job id) whenever a job reaches a final status,
-- by whatever path; pgworkerd.wait() listens for it.
CREATE FUNCTION @schema@.notify_finished()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify(@schema_literal@ || '.finished', NEW.id::text);
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_notify_finished
    AFTER UPDATE OF status ON @schema@.jobs
    FOR EACH ROW
    WHEN (NEW.status IN ('completed', 'dead', 'cancelled')
          AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION @schema@.notify_finished();

-- Targeted wake-ups (0013): a notification per inserted batch that names it.

-- After every statement that inserted jobs (enqueue, enqueue_many, their _v2 versions,
-- schedule_fire, a direct INSERT by whatever role): one wake-up per queue and handler
-- inserted, {"q": queue, "h": handler, "id": the lowest new id, "n": how many, ...}, sent
-- on commit. A statement trigger, so a bulk enqueue of 10,000 jobs of one handler sends
-- one wake-up, not 10,000. Since 0040 it goes to the daemons chosen for it on their own
-- channels (workers_wake, workers.sql; SECURITY DEFINER for it: the registry is not the
-- inserting role's to read), else to '<schema>.wake' as before. Names longer than
-- enqueue allows (a direct INSERT) are left out of the payload rather than failing the
-- insert on NOTIFY's 8,000-byte limit: daemons treat a payload without names as a wake-up
-- for every handler.
CREATE FUNCTION @schema@.notify_wake()
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

CREATE TRIGGER jobs_notify_wake
    AFTER INSERT ON @schema@.jobs
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.notify_wake();

-- The attempt history (attempts.sql) is written by these triggers, whatever ended the
-- attempt (a daemon's finish of any release, a worker finishing from SQL, another
-- daemon's claim rescuing an expired lease).

-- A running attempt ended because another claim took the job over (its lease ran out and
-- a claim rescued or buried it): say so in words an operator can act on, naming the
-- daemon and its host (the registry's row), ahead of the claim's own text.
CREATE FUNCTION @schema@.attempt_lease_expired()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    where_ran text;
BEGIN
    SELECT ' on ' || w.host INTO where_ran FROM @schema@.workers w WHERE w.id = OLD.locked_by;
    NEW.last_error := 'lease expired: daemon ' || coalesce(OLD.locked_by, '?')
        || coalesce(where_ran, '') || ' stopped renewing'
        || coalesce(' (' || NEW.last_error || ')', '');
    RETURN NEW;
END;
$$;

CREATE TRIGGER jobs_attempt_lease_expired
    BEFORE UPDATE ON @schema@.jobs
    FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.lease_token IS DISTINCT FROM OLD.lease_token)
    EXECUTE FUNCTION @schema@.attempt_lease_expired();

-- Record a running attempt that ended: the job left 'running', or stayed there under a
-- new lease token (rescued). Renewals and claims of pending jobs do not fire it.
CREATE FUNCTION @schema@.attempt_record()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    outcome text;
BEGIN
    outcome := CASE
        WHEN NEW.lease_token IS DISTINCT FROM OLD.lease_token THEN 'lease expired'
        WHEN NEW.status = 'completed' THEN 'completed'
        WHEN NEW.status = 'cancelled' THEN 'cancelled'
        WHEN NEW.status = 'dead' THEN 'dead'
        WHEN NEW.attempts < OLD.attempts AND NEW.snoozes > OLD.snoozes THEN 'snoozed'
        -- a WaitFor (job_suspend, 0028): a new wait began
        WHEN NEW.wait_since IS DISTINCT FROM OLD.wait_since THEN 'waited'
        WHEN NEW.attempts < OLD.attempts THEN 'released'
        ELSE 'failed' END;
    INSERT INTO @schema@.attempts AS a
        (job_id, lease_token, attempt, worker, host, started_at, outcome, error,
         wall_seconds)
    VALUES (OLD.id, OLD.lease_token, OLD.attempts, OLD.locked_by,
            (SELECT w.host FROM @schema@.workers w WHERE w.id = OLD.locked_by),
            OLD.started_at, outcome,
            CASE WHEN outcome IN ('failed', 'dead', 'lease expired')
                      OR NEW.last_error IS DISTINCT FROM OLD.last_error
                 THEN NEW.last_error END,
            extract(epoch FROM now() - OLD.started_at)::float8)
    -- (a token is never reused; should a row exist anyway, the first record stands)
    ON CONFLICT (job_id, lease_token) DO NOTHING;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_attempt_record
    AFTER UPDATE ON @schema@.jobs
    FOR EACH ROW
    WHEN (OLD.status = 'running'
          AND (NEW.status <> 'running' OR NEW.lease_token IS DISTINCT FROM OLD.lease_token))
    EXECUTE FUNCTION @schema@.attempt_record();

-- Deleted jobs (`pgworkerd prune`, by whatever role or release) take their history
-- along: one statement per DELETE, however many jobs it removed.
CREATE FUNCTION @schema@.attempt_forget()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        TRUNCATE @schema@.attempts;
    ELSE
        DELETE FROM @schema@.attempts a USING gone g WHERE a.job_id = g.id;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_attempt_forget
    AFTER DELETE ON @schema@.jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.attempt_forget();

CREATE TRIGGER jobs_attempt_forget_all
    AFTER TRUNCATE ON @schema@.jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.attempt_forget();

REVOKE EXECUTE ON FUNCTION @schema@.attempt_lease_expired() FROM PUBLIC;

REVOKE EXECUTE ON FUNCTION @schema@.attempt_record() FROM PUBLIC;

REVOKE EXECUTE ON FUNCTION @schema@.attempt_forget() FROM PUBLIC;

-- The captured output of a job's attempts (job_logs.sql) goes with the job.

-- Deleted jobs (`pgworkerd prune`, retention's prune_finished_v1, any DELETE or TRUNCATE
-- by whatever role) take their logs along: one statement per DELETE.
CREATE FUNCTION @schema@.job_logs_forget()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        TRUNCATE @schema@.job_logs;
    ELSE
        DELETE FROM @schema@.job_logs l USING gone g WHERE l.job_id = g.id;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_logs_forget
    AFTER DELETE ON @schema@.jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.job_logs_forget();

CREATE TRIGGER jobs_logs_forget_all
    AFTER TRUNCATE ON @schema@.jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.job_logs_forget();

REVOKE EXECUTE ON FUNCTION @schema@.job_logs_forget() FROM PUBLIC;

-- Lease tokens (the fence every renew and finish names) were a counter: who saw one
-- token knew the next. Every new token is drawn at random now, from the server's strong
-- random source (gen_random_uuid, pg_strong_random): 60 random bits, plus 2^60 so that
-- every new token is above every counter token of earlier releases. One trigger, whatever
-- statement claims (claim_jobs, the claims of older releases, a burial), so no claim text
-- changes. A token is never ordered: attempts and logs are ordered by time.
CREATE FUNCTION @schema@.lease_token_draw()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    LOOP
        -- the uuid's last 8 bytes: 62 random bits (the variant takes 2), 60 of them kept
        NEW.lease_token := (1::bigint << 60)
            | (('x' || encode(substr(uuid_send(gen_random_uuid()), 9, 8), 'hex'))::bit(64)::bigint
               & ((1::bigint << 60) - 1));
        EXIT WHEN NEW.lease_token <> OLD.lease_token;
    END LOOP;
    RETURN NEW;
END;
$$;

CREATE TRIGGER jobs_lease_token_drawn
    BEFORE UPDATE OF lease_token ON @schema@.jobs
    FOR EACH ROW
    WHEN (NEW.lease_token IS DISTINCT FROM OLD.lease_token)
    EXECUTE FUNCTION @schema@.lease_token_draw();

-- Reading one job.

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
            OR has_any_column_privilege(session_user, '@schema@.jobs', 'SELECT'));
END;
$$;

-- What a daemon whose outcome was refused checks (outcomes.py): the job's status and
-- holder, and whether its token is still the one the caller names, without the token
-- itself (roles.sql does not let the daemon role read tokens: it could end or renew
-- another host's attempt with one). No row: no such job.
CREATE FUNCTION @schema@.job_lease_state_v1(id bigint, token bigint)
RETURNS TABLE (status text, token_holds boolean, locked_by text)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT j.status::text, j.lease_token = job_lease_state_v1.token, j.locked_by
      FROM @schema@.jobs j
     WHERE j.id = job_lease_state_v1.id;
$$;
REVOKE EXECUTE ON FUNCTION @schema@.job_lease_state_v1(bigint, bigint) FROM PUBLIC;

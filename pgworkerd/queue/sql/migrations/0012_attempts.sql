-- Per-attempt history and accounting (issue 12).
-- compatible-with-code-of-schema: 5
--
-- An expand migration (README "Upgrading"): a new table and two row triggers on jobs; no
-- function or column of jobs changes, so release 0.2 daemons and code of schema 5 run on
-- (their finishes and rescues are recorded by the triggers too, without resource figures).

-- One row per ended attempt: where it ran, how it ended and why, what it cost. Written by
-- the trigger below whatever ended the attempt (a daemon's finish of any release, a
-- worker finishing from SQL, another daemon's claim rescuing an expired lease); the
-- daemon then adds what it measured (attempt_account in queries.sql). Keyed by the
-- attempt's lease token: every claim bumps it, so it names exactly one attempt of the
-- job (an attempt number recurs after a release or a snooze). Removed with its job by
-- the triggers below (not a foreign key: TRUNCATE of jobs keeps working, and a finish
-- does not pay for a key check).
CREATE TABLE @schema@.attempts (
    job_id             bigint NOT NULL,
    lease_token        bigint NOT NULL,
    attempt            integer NOT NULL,
    worker             text,
    host               text,
    started_at         timestamptz,
    finished_at        timestamptz NOT NULL DEFAULT now(),
    outcome            text NOT NULL
                       CONSTRAINT attempts_outcome_known CHECK (outcome IN (
                           'completed', 'failed', 'dead', 'cancelled', 'released',
                           'snoozed', 'lease expired')),
    error              text,
    -- measured by the daemon that ran it (NULL: not measured, e.g. a worker in another
    -- language, a daemon of an older release, or one that died with the attempt)
    wall_seconds       float8,
    cpu_user_seconds   float8,
    cpu_system_seconds float8,
    peak_memory        bigint,  -- bytes, the job's whole process tree
    PRIMARY KEY (job_id, lease_token)
);

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

-- The attempt history (0012). Its rows are written by the triggers on jobs (jobs.sql);
-- the daemon adds what it measured with attempt_account_v1.

-- One row per ended attempt: where it ran, how it ended and why, what it cost. Written by
-- the triggers on jobs (jobs.sql) whatever ended the attempt (a daemon's finish of any
-- release, a worker finishing from SQL, another daemon's claim rescuing an expired
-- lease); the daemon then adds what it measured (attempt_account in
-- queries/attempts.sql). Keyed by the attempt's lease token: every claim bumps it, so it
-- names exactly one attempt of the job (an attempt number recurs after a release or a
-- snooze). Removed with its job by the triggers on jobs (not a foreign key: TRUNCATE of
-- jobs keeps working, and a finish does not pay for a key check).
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
                           'snoozed', 'lease expired', 'waited')),
    error              text,
    -- measured by the daemon that ran it (NULL: not measured, e.g. a worker in another
    -- language, a daemon of an older release, or one that died with the attempt)
    wall_seconds       float8,
    cpu_user_seconds   float8,
    cpu_system_seconds float8,
    peak_memory        bigint,  -- bytes, the job's whole process tree
    PRIMARY KEY (job_id, lease_token)
);

-- Throughput and failures over the last hour (views.throughput): attempts by end time.
-- Append-only (one row per ended attempt), so it costs one entry per attempt.
CREATE INDEX attempts_finished_at_idx ON @schema@.attempts (finished_at);

-- What the daemon measured of its own attempts (the daemon's attempt_account; 0012):
-- only rows naming the calling worker and the attempt's token. Returns the rows changed.
CREATE FUNCTION @schema@.attempt_account_v1(
    worker text, ids bigint[], tokens bigint[], wall float8[], cpu_user float8[],
    cpu_system float8[], peak_memory bigint[])
RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE @schema@.attempts a
       SET wall_seconds = u.wall, cpu_user_seconds = u.cpu_user,
           cpu_system_seconds = u.cpu_system, peak_memory = u.peak_memory
      FROM unnest(attempt_account_v1.ids, attempt_account_v1.tokens, attempt_account_v1.wall,
                  attempt_account_v1.cpu_user, attempt_account_v1.cpu_system,
                  attempt_account_v1.peak_memory)
           AS u(id, token, wall, cpu_user, cpu_system, peak_memory)
     WHERE a.job_id = ANY(attempt_account_v1.ids)  -- by primary key, whatever the plan expects
       AND a.job_id = u.id AND a.lease_token = u.token AND a.worker = attempt_account_v1.worker
    RETURNING a.job_id;
END;
$$;

REVOKE EXECUTE ON FUNCTION
    @schema@.attempt_account_v1(text, bigint[], bigint[], float8[], float8[], float8[],
                                bigint[])
    FROM PUBLIC;

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

-- The charts' rollup (0038, issue 27): ended attempts per handler and time bucket, kept by
-- the daemons (attempt_rollups_advance) so that the dashboard's charts over up to 7 days
-- read at most (points x handlers) rows, whatever the number of jobs. Four grains, one per
-- chart window, so that none reads more than 72 points per handler: minutes and 5 minutes
-- (kept a day: the 1 h and 6 h charts), hours and 3 hours (kept 35 days: the 24 h and
-- 7 d charts). (Summing 360 minutes x 50 handlers for a 6 h chart cost the page ~300 ms.)
-- run_counts and wait_counts are histograms over attempt_rollup_bounds(): element i counts
-- the values in [bounds[i], bounds[i + 1]) (element 0: below bounds[1]; the last: at or
-- above the last bound), as width_bucket numbers them from 0.
CREATE TABLE @schema@.attempt_rollups (
    grain_seconds integer NOT NULL
                  CONSTRAINT attempt_rollups_grain_known CHECK (grain_seconds IN (60, 300, 3600, 10800)),
    bucket_start  timestamptz NOT NULL,
    handler       text NOT NULL,
    completed     bigint NOT NULL DEFAULT 0,
    -- attempts that failed: 'failed', 'dead' and 'lease expired' (views.FAILED_OUTCOMES)
    failed        bigint NOT NULL DEFAULT 0,
    -- wall time of attempts that ran to an end (completed, failed, dead)
    run_counts    bigint[] NOT NULL,
    -- claim - due time (its run_at, or its enqueue if later) of each job's last attempt
    -- ended completed, dead or cancelled: a retried attempt's run_at is overwritten by
    -- its retry, so only the last attempt's wait is known
    wait_counts   bigint[] NOT NULL,
    PRIMARY KEY (grain_seconds, bucket_start, handler),
    -- one element per bucket of attempt_rollup_bounds() (16 bounds: 17 buckets)
    CONSTRAINT attempt_rollups_histograms_sized
        CHECK (cardinality(run_counts) = 17 AND cardinality(wait_counts) = 17)
);

-- How far the rollup has counted: every attempt with finished_at before rolled_to is in
-- attempt_rollups. One row.
CREATE TABLE @schema@.attempt_rollup_cursor (
    only_row  boolean PRIMARY KEY DEFAULT true
              CONSTRAINT attempt_rollup_cursor_one_row CHECK (only_row),
    rolled_to timestamptz NOT NULL
);
INSERT INTO @schema@.attempt_rollup_cursor (rolled_to) VALUES (now());

-- The histograms' bucket bounds in seconds (as the Prometheus metrics' LATENCY_BUCKETS):
-- from a few ms to an hour.
CREATE FUNCTION @schema@.attempt_rollup_bounds()
RETURNS float8[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ARRAY[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900,
                 3600]::float8[]
$$;

-- One step of the rollup (the daemons' sweep; any one daemon at a time: the cursor row is
-- taken with SKIP LOCKED, so a second caller returns NULL at once). Counts the attempts
-- that ended from the cursor on: at most about max_attempts of them (the rows after the
-- cursor are read through attempts_finished_at_idx, a bounded range; the handler and due
-- time by the jobs' primary key), and none that ended within lag_seconds of now(): an
-- attempt's finished_at is its transaction's start, so a row may commit a little after
-- it (a row that commits more than lag_seconds late is not counted). Then it drops
-- buckets past their keeping (minutes after a day, hours after 35 days). Returns the new
-- cursor and whether attempts past it are already due (the caller steps again soon).
CREATE FUNCTION @schema@.attempt_rollups_advance(max_attempts integer, lag_seconds float8)
RETURNS TABLE (rolled_to timestamptz, behind boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    since timestamptz;
    upto timestamptz;
    newest timestamptz;
    bounds float8[] := @schema@.attempt_rollup_bounds();
BEGIN
    IF (attempt_rollups_advance.max_attempts BETWEEN 1 AND 1000000) IS NOT TRUE THEN
        PERFORM @schema@.fenced_refuse('rolling up attempts',
            'max_attempts must be from 1 to 1000000, not '
            || coalesce(attempt_rollups_advance.max_attempts::text, 'NULL'));
    ELSIF (attempt_rollups_advance.lag_seconds BETWEEN 0 AND 3600) IS NOT TRUE THEN
        PERFORM @schema@.fenced_refuse('rolling up attempts',
            'lag_seconds must be from 0 to 3600, not '
            || coalesce(attempt_rollups_advance.lag_seconds::text, 'NULL'));
    END IF;
    SELECT c.rolled_to INTO since
      FROM @schema@.attempt_rollup_cursor c FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;  -- another daemon is rolling up
    END IF;
    newest := now() - make_interval(secs => attempt_rollups_advance.lag_seconds);
    IF since >= newest THEN
        RETURN QUERY SELECT since, false;
        RETURN;
    END IF;
    -- the finished_at of the max_attempts-th attempt after the cursor (index range scan)
    SELECT a.finished_at INTO upto
      FROM @schema@.attempts a
     WHERE a.finished_at >= since AND a.finished_at < newest
     ORDER BY a.finished_at
    OFFSET attempt_rollups_advance.max_attempts LIMIT 1;
    IF upto IS NULL THEN
        upto := newest;
    ELSIF upto = since THEN
        -- more than max_attempts ended at one instant (one transaction): take them all
        upto := since + interval '1 microsecond';
    END IF;
    INSERT INTO @schema@.attempt_rollups AS r
        (grain_seconds, bucket_start, handler, completed, failed, run_counts, wait_counts)
    -- one pass: each histogram element a filtered count (no work per group)
    SELECT g.grain, date_bin(make_interval(secs => g.grain), b.finished_at,
                             timestamptz '2000-01-01 00:00:00+00'),
           b.handler,
           count(*) FILTER (WHERE b.outcome = 'completed'),
           count(*) FILTER (WHERE b.outcome IN ('failed', 'dead', 'lease expired')),
           ARRAY[count(*) FILTER (WHERE b.run_bin = 0),
                 count(*) FILTER (WHERE b.run_bin = 1),
                 count(*) FILTER (WHERE b.run_bin = 2),
                 count(*) FILTER (WHERE b.run_bin = 3),
                 count(*) FILTER (WHERE b.run_bin = 4),
                 count(*) FILTER (WHERE b.run_bin = 5),
                 count(*) FILTER (WHERE b.run_bin = 6),
                 count(*) FILTER (WHERE b.run_bin = 7),
                 count(*) FILTER (WHERE b.run_bin = 8),
                 count(*) FILTER (WHERE b.run_bin = 9),
                 count(*) FILTER (WHERE b.run_bin = 10),
                 count(*) FILTER (WHERE b.run_bin = 11),
                 count(*) FILTER (WHERE b.run_bin = 12),
                 count(*) FILTER (WHERE b.run_bin = 13),
                 count(*) FILTER (WHERE b.run_bin = 14),
                 count(*) FILTER (WHERE b.run_bin = 15),
                 count(*) FILTER (WHERE b.run_bin = 16)],
           ARRAY[count(*) FILTER (WHERE b.wait_bin = 0),
                 count(*) FILTER (WHERE b.wait_bin = 1),
                 count(*) FILTER (WHERE b.wait_bin = 2),
                 count(*) FILTER (WHERE b.wait_bin = 3),
                 count(*) FILTER (WHERE b.wait_bin = 4),
                 count(*) FILTER (WHERE b.wait_bin = 5),
                 count(*) FILTER (WHERE b.wait_bin = 6),
                 count(*) FILTER (WHERE b.wait_bin = 7),
                 count(*) FILTER (WHERE b.wait_bin = 8),
                 count(*) FILTER (WHERE b.wait_bin = 9),
                 count(*) FILTER (WHERE b.wait_bin = 10),
                 count(*) FILTER (WHERE b.wait_bin = 11),
                 count(*) FILTER (WHERE b.wait_bin = 12),
                 count(*) FILTER (WHERE b.wait_bin = 13),
                 count(*) FILTER (WHERE b.wait_bin = 14),
                 count(*) FILTER (WHERE b.wait_bin = 15),
                 count(*) FILTER (WHERE b.wait_bin = 16)]
      FROM (SELECT a.finished_at, a.outcome, left(j.handler, 200) AS handler,
                   CASE WHEN a.outcome IN ('completed', 'failed', 'dead')
                        THEN width_bucket(a.wall_seconds, bounds) END AS run_bin,
                   CASE WHEN a.outcome IN ('completed', 'dead', 'cancelled')
                             AND a.lease_token = j.lease_token
                        THEN width_bucket(greatest(0, extract(epoch FROM a.started_at
                                 - greatest(j.run_at, j.created_at)))::float8, bounds)
                        END AS wait_bin
              FROM @schema@.attempts a
              JOIN @schema@.jobs j ON j.id = a.job_id
             WHERE a.finished_at >= since AND a.finished_at < upto) AS b
     CROSS JOIN (VALUES (60), (300), (3600), (10800)) AS g(grain)
     GROUP BY 1, 2, 3
    ON CONFLICT (grain_seconds, bucket_start, handler) DO UPDATE
       SET completed = r.completed + EXCLUDED.completed,
           failed = r.failed + EXCLUDED.failed,
           run_counts = ARRAY(SELECT x + y FROM unnest(r.run_counts, EXCLUDED.run_counts)
                                        WITH ORDINALITY AS u(x, y, i) ORDER BY i),
           wait_counts = ARRAY(SELECT x + y FROM unnest(r.wait_counts, EXCLUDED.wait_counts)
                                         WITH ORDINALITY AS u(x, y, i) ORDER BY i);
    UPDATE @schema@.attempt_rollup_cursor SET rolled_to = upto;
    DELETE FROM @schema@.attempt_rollups r
     WHERE (r.grain_seconds IN (60, 300) AND r.bucket_start < now() - interval '1 day')
        OR (r.grain_seconds IN (3600, 10800) AND r.bucket_start < now() - interval '35 days');
    RETURN QUERY SELECT upto, upto < newest;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.attempt_rollups_advance(integer, float8) FROM PUBLIC;

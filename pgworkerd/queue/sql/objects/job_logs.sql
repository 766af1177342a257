-- Per-attempt job logs (0015): the captured output of each attempt, written by its
-- daemon with job_log_write_v1, removed with its job by the triggers on jobs (jobs.sql).

-- One row per attempt that printed something, keyed like the attempt history (0012) by
-- the attempt's lease token (an attempt number recurs after a release or a snooze). The
-- daemon that runs the attempt upserts it at most once a second while it runs and once
-- more when it ended (finished = true). Bounded: `head` is the first half of the
-- daemon's [logs] max_bytes_per_attempt, `tail` the last half; omitted_bytes is what lies
-- between them (0: head followed by tail is the whole output). total_bytes counts every
-- byte the attempt wrote. Text as PostgreSQL can hold it: NULs removed, invalid UTF-8
-- replaced (by the daemon). Removed with its job by the triggers on jobs.
CREATE TABLE @schema@.job_logs (
    job_id        bigint NOT NULL,
    lease_token   bigint NOT NULL,
    attempt       integer NOT NULL,
    worker        text NOT NULL,
    head          text NOT NULL DEFAULT '',
    tail          text NOT NULL DEFAULT '',
    total_bytes   bigint NOT NULL DEFAULT 0,
    omitted_bytes bigint NOT NULL DEFAULT 0,
    finished      boolean NOT NULL DEFAULT false,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, lease_token)
);

-- Captured output (the daemon's job_log_write; 0015), written only for attempts the
-- calling worker holds or held: the job is running under that worker and token, or the
-- attempt history (0012, written by a trigger) names that worker for that token (the
-- last write after the attempt ended). A log row another worker wrote is never changed.
-- A NULL (or empty) head keeps the stored one. Returns the job ids written.
CREATE FUNCTION @schema@.job_log_write_v1(
    worker text, ids bigint[], tokens bigint[], attempts integer[], heads text[],
    tails text[], totals bigint[], omitted bigint[], finished boolean[])
RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    INSERT INTO @schema@.job_logs AS l
           (job_id, lease_token, attempt, worker, head, tail, total_bytes, omitted_bytes,
            finished, updated_at)
    SELECT u.id, u.token, u.attempt, job_log_write_v1.worker, coalesce(u.head, ''), u.tail,
           u.total, u.omitted, u.finished, now()
      FROM unnest(job_log_write_v1.ids, job_log_write_v1.tokens, job_log_write_v1.attempts,
                  job_log_write_v1.heads, job_log_write_v1.tails, job_log_write_v1.totals,
                  job_log_write_v1.omitted, job_log_write_v1.finished)
           AS u(id, token, attempt, head, tail, total, omitted, finished)
     WHERE EXISTS (SELECT 1 FROM @schema@.jobs j
                    WHERE j.id = u.id AND j.lease_token = u.token
                      AND j.locked_by = job_log_write_v1.worker
                      AND j.status::text = 'running')
        OR EXISTS (SELECT 1 FROM @schema@.attempts a
                    WHERE a.job_id = u.id AND a.lease_token = u.token
                      AND a.worker = job_log_write_v1.worker)
    ON CONFLICT (job_id, lease_token) DO UPDATE
       SET head = CASE WHEN EXCLUDED.head = '' THEN l.head ELSE EXCLUDED.head END,
           tail = EXCLUDED.tail, total_bytes = EXCLUDED.total_bytes,
           omitted_bytes = EXCLUDED.omitted_bytes, finished = EXCLUDED.finished,
           updated_at = EXCLUDED.updated_at
     WHERE l.worker = EXCLUDED.worker
    RETURNING l.job_id;
END;
$$;

REVOKE EXECUTE ON FUNCTION
    @schema@.job_log_write_v1(text, bigint[], bigint[], integer[], text[], text[], bigint[],
                              bigint[], boolean[])
    FROM PUBLIC;

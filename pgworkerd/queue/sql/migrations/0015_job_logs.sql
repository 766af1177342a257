-- Per-attempt job logs (issue 13): what a job printed (stdout, stderr, Python logging).
-- compatible-with-code-of-schema: 5
--
-- An expand migration (README "Upgrading"): a new table and one statement trigger pair on
-- jobs; nothing existing changes, so older daemons run on (they capture nothing).

-- One row per attempt that printed something, keyed like the attempt history (0012) by
-- the attempt's lease token (an attempt number recurs after a release or a snooze). The
-- daemon that runs the attempt upserts it at most once a second while it runs and once
-- more when it ended (finished = true). Bounded: `head` is the first half of the
-- daemon's [logs] max_bytes_per_attempt, `tail` the last half; omitted_bytes is what lies
-- between them (0: head followed by tail is the whole output). total_bytes counts every
-- byte the attempt wrote. Text as PostgreSQL can hold it: NULs removed, invalid UTF-8
-- replaced (by the daemon). Removed with its job by the triggers below.
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

-- Handler-controlled outcomes and the completion notification (issue 11).
-- compatible-with-code-of-schema: 5
--
-- An expand migration (README "Upgrading"): one new column with a default, one new
-- trigger; no existing function or signature changes, so release 0.2 daemons and the
-- code of schema 5 run on as before (their finishes fire the trigger too).

-- How many times the job was snoozed (a handler raised pgworkerd.Snooze): each snooze
-- hands the attempt back uncounted, so this is what bounds a job that snoozes forever
-- (a handler's max_snoozes; the daemon's job_snooze statement). `show` prints it.
ALTER TABLE @schema@.jobs
    ADD COLUMN snoozes integer NOT NULL DEFAULT 0
    CONSTRAINT jobs_snoozes_not_negative CHECK (snoozes >= 0);

-- A job reached a final status (completed, dead, cancelled) by whatever path: a daemon's
-- finish of any release, the claim burying an expired job, an operator's cancel of a
-- pending job, SQL workers. NOTIFY '<schema>.finished' with the job id as payload, sent
-- on commit; pgworkerd.wait() listens for it. A row trigger, so every path is covered,
-- including code that does not know about it.
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

-- Finishing a claimed job from SQL with the outcomes a handler may choose (next to 0005's
-- complete_job, fail_job, release_job; tests/integration/test_sql_finish.py holds them
-- equal to the daemon's statements). Fenced by the lease like those; SECURITY INVOKER.

-- The handler asked to run again in delay_seconds (0 to 2592000, 30 days; anything else
-- raises 22023 and changes nothing), which is not a failure: pending again at
-- now() + delay, the attempt not counted, snoozes + 1 (cancelled instead if a cancel was
-- requested), progress and a checkpoint saved (NULL keeps the saved ones), last_error
-- kept. A job that has snoozed max_snoozes times already gets a failed attempt instead
-- (fail_job with its default backoff, the error saying why). Returns the new status and
-- run_at; no row: the lease was lost and nothing changed.
CREATE FUNCTION @schema@.snooze_job(
    job_id bigint, worker text, token bigint, delay_seconds float8,
    max_snoozes integer DEFAULT 100,
    progress jsonb DEFAULT NULL, checkpoint jsonb DEFAULT NULL)
RETURNS TABLE (status text, run_at timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- (NaN is above every number in PostgreSQL: refused too)
    IF snooze_job.delay_seconds IS NULL
       OR NOT (snooze_job.delay_seconds BETWEEN 0 AND 2592000) THEN
        RAISE EXCEPTION 'pgworkerd: a snooze must be from 0 to 2592000 seconds (30 days), not %',
            coalesce(snooze_job.delay_seconds::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    UPDATE @schema@.jobs j
       SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                         ELSE 'pending' END::@schema@.job_status,
           run_at = CASE WHEN j.cancel_requested THEN j.run_at
                         ELSE now() + make_interval(secs => snooze_job.delay_seconds) END,
           finished_at = CASE WHEN j.cancel_requested THEN now() END,
           attempts = j.attempts - 1,
           snoozes = j.snoozes + 1,
           progress = coalesce(snooze_job.progress, j.progress),
           checkpoint = coalesce(snooze_job.checkpoint, j.checkpoint),
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           updated_at = now()
     WHERE j.id = snooze_job.job_id AND j.locked_by = snooze_job.worker
       AND j.lease_token = snooze_job.token AND j.status = 'running'
       AND j.snoozes < coalesce(snooze_job.max_snoozes, 100)
    RETURNING j.status::text, j.run_at;
    IF NOT FOUND THEN
        -- max_snoozes used up (or the lease lost: fail_job is fenced the same way)
        RETURN QUERY
        SELECT * FROM @schema@.fail_job(
            snooze_job.job_id, snooze_job.worker, snooze_job.token,
            'snoozed ' || coalesce(snooze_job.max_snoozes, 100)
                || ' times already (max_snoozes): this snooze counts as a failed attempt',
            progress => snooze_job.progress, checkpoint => snooze_job.checkpoint);
    END IF;
END;
$$;

-- The handler gave up: dead at once, whatever attempts are left, with the reason as
-- last_error. False: the lease was lost and nothing changed.
CREATE FUNCTION @schema@.give_up_job(job_id bigint, worker text, token bigint, reason text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    UPDATE @schema@.jobs j
       SET status = 'dead', last_error = give_up_job.reason,
           locked_by = NULL, locked_until = NULL, cancel_requested = false,
           finished_at = now(), updated_at = now()
     WHERE j.id = give_up_job.job_id AND j.locked_by = give_up_job.worker
       AND j.lease_token = give_up_job.token AND j.status = 'running';
    RETURN FOUND;
END;
$$;

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

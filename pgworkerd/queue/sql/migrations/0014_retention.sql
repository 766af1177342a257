-- Automatic retention (issue 14): the fleet prunes its own finished jobs.
-- compatible-with-code-of-schema: 5
--
-- An expand migration (README "Upgrading"): one new function, nothing existing changes,
-- so older daemons run on as before (they just do not prune).

-- Delete one small batch of finished jobs past their retention: completed, cancelled and
-- dead each with their own (seconds; NULL keeps that status forever), oldest first, at
-- most p_batch rows (1..10000) in all. History rows of a deleted job go with it, in the
-- same statement: the attempts of migration 0012 are removed by its AFTER DELETE
-- trigger on jobs (a table added later that keeps history references jobs ON DELETE
-- CASCADE or does the same).
--
-- One caller at a time per schema, under a transaction-level advisory lock: a caller
-- that finds it taken deletes nothing and gets deleted = NULL at once (someone else is
-- pruning). Rows locked by anyone (an operator's retry, a claim's rescue) are skipped,
-- not waited for, and a batch holds its row locks only for its own short transaction.
-- live_daemons (the registry's daemons not gone) lets each daemon space its calls so
-- that the fleet as a whole looks about once per interval, whatever its size.
--
-- SECURITY DEFINER, owned by the schema owner: the daemon role gets EXECUTE, not DELETE
-- on jobs, so it can remove finished jobs older than a retention and nothing else.
CREATE FUNCTION @schema@.prune_finished_v1(
    p_completed float8, p_cancelled float8, p_dead float8, p_batch integer,
    OUT deleted integer, OUT live_daemons integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    retention float8[] := ARRAY[p_completed, p_cancelled, p_dead];
    statuses @schema@.job_status[] := ARRAY['completed', 'cancelled', 'dead'];
    n integer;
BEGIN
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 10000 THEN
        RAISE EXCEPTION 'prune_finished_v1: batch must be 1..10000, not %', p_batch
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(retention) r WHERE r < 0 OR r = 'NaN'::float8) THEN
        RAISE EXCEPTION 'prune_finished_v1: a retention must be >= 0 seconds'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT count(*) INTO live_daemons FROM @schema@.workers WHERE state <> 'gone';
    IF NOT pg_try_advisory_xact_lock(
            hashtextextended('pgworkerd.retention:' || @schema_literal@, 0)) THEN
        RETURN;  -- deleted stays NULL: another daemon is pruning
    END IF;
    deleted := 0;
    FOR i IN 1..3 LOOP
        CONTINUE WHEN retention[i] IS NULL OR deleted >= p_batch;
        -- jobs_finished_at_idx, oldest first
        DELETE FROM @schema@.jobs
         WHERE id IN (SELECT id FROM @schema@.jobs
                       WHERE finished_at < now() - make_interval(secs => retention[i])
                         AND status = statuses[i]
                       ORDER BY finished_at
                       LIMIT p_batch - deleted
                       FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS n = ROW_COUNT;
        deleted := deleted + n;
    END LOOP;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.prune_finished_v1(float8, float8, float8, integer)
    FROM PUBLIC;

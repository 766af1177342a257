-- Follow-ups atomic with the finish, and the lease in the handler's hands (issue 24, items
-- 3 and 6).
-- compatible-with-code-of-schema: 5
--
-- An expand migration (docs/operations/upgrading.md): it only adds a table, its trigger
-- on jobs and three functions; no existing function changes, so older code runs on (and
-- completes jobs without follow-ups through complete_jobs, exactly as before). The
-- declaration is objects/follow_ups.sql; this is the same text.
-- Follow-ups and the lease in the handler's hands (0029, issue 24 items 3 and 6).
--
-- Follow-ups: jobs a handler returns with its result (pgworkerd.Done(result, then=[...])),
-- inserted in the SAME transaction as the fenced completion, by
-- jobs_complete_with_follow_ups (the daemon's job_complete_with_follow_ups) and
-- job_complete_with_follow_ups (one job, other languages). A holder whose lease was lost
-- completes nothing and so inserts nothing; a completed job cannot be completed again, so
-- its follow-ups are inserted exactly once, whatever crashes where (the completion and
-- the inserts commit together or not at all). Each list goes through enqueue_many_v3
-- (its checks, messages and the enqueue bounds of the calling login). A list that is
-- refused (not an array of job objects, too long, an invalid job, a bound) changes nothing
-- of its job nor of any other: the job stays running under its lease and the function
-- says why (`refused`); the daemon then records the attempt as failed with that reason
-- (retried like any failure).
--
-- The lease in the handler's hands: job_lease_assert(job_id, token), called by an
-- application in its own transaction, makes that transaction's writes conditional on the
-- job still running under the token the handler was given (job.lease_token).

-- Which jobs a completion inserted: one row per follow-up, in the handler's order. A
-- follow-up with a dedupe key that matched a live job names that job (enqueue_many_v3
-- returns its id), so follow_up_id is not unique. Rows go with the completed job
-- (job_follow_ups_forget); a pruned follow-up leaves its row (show says "gone").
CREATE TABLE @schema@.job_follow_ups (
    job_id       bigint NOT NULL,
    position     integer NOT NULL,
    follow_up_id bigint NOT NULL,
    PRIMARY KEY (job_id, position)
);

-- "Follow-up of job N" on the follow-up's page.
CREATE INDEX job_follow_ups_follow_up_idx ON @schema@.job_follow_ups (follow_up_id);

-- Deleted jobs (prune, any DELETE or TRUNCATE) take their follow-up rows along: one
-- statement per DELETE. A DELETE of jobs without follow-ups costs one index probe per
-- deleted job.
CREATE FUNCTION @schema@.job_follow_ups_forget()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        TRUNCATE @schema@.job_follow_ups;
    ELSE
        DELETE FROM @schema@.job_follow_ups f USING gone g WHERE f.job_id = g.id;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_follow_ups_forget
    AFTER DELETE ON @schema@.jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.job_follow_ups_forget();

CREATE TRIGGER jobs_follow_ups_forget_all
    AFTER TRUNCATE ON @schema@.jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.job_follow_ups_forget();

REVOKE EXECUTE ON FUNCTION @schema@.job_follow_ups_forget() FROM PUBLIC;

-- complete with follow-ups: the daemon's job_complete_with_follow_ups, for a batch of
-- which at least one job has follow-ups (a batch without any goes through complete_jobs,
-- whose cost this leaves unchanged). follow_ups: one element per job, NULL or '[]' for
-- none, else a JSON array of at most 1000 job objects as enqueue_many_v3 takes them.
-- Returns one row per job completed (follow_up_ids: the ids enqueue_many_v3 returned, in
-- order; NULL: none) and one per job whose follow-ups were refused (refused: why; that job
-- is left running, its lease held, nothing of it changed). A job missing from the result
-- lost its lease: nothing of it changed and nothing was inserted. All the lists go in one
-- enqueue_many_v3 call (one subtransaction); only when that refuses one is each job tried
-- alone, in a subtransaction of its own.
CREATE FUNCTION @schema@.jobs_complete_with_follow_ups(
    worker text, ids bigint[], tokens bigint[], results jsonb[], progress jsonb[],
    follow_ups jsonb[])
RETURNS TABLE (id bigint, follow_up_ids bigint[], refused text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text := coalesce(
        @schema@.fenced_batch_problem(jobs_complete_with_follow_ups.worker,
                                      jobs_complete_with_follow_ups.ids,
                                      jobs_complete_with_follow_ups.tokens,
                                      jobs_complete_with_follow_ups.results),
        @schema@.fenced_batch_problem(jobs_complete_with_follow_ups.worker,
                                      jobs_complete_with_follow_ups.ids,
                                      jobs_complete_with_follow_ups.tokens,
                                      jobs_complete_with_follow_ups.progress),
        @schema@.fenced_batch_problem(jobs_complete_with_follow_ups.worker,
                                      jobs_complete_with_follow_ups.ids,
                                      jobs_complete_with_follow_ups.tokens,
                                      jobs_complete_with_follow_ups.follow_ups));
    -- the jobs without follow-ups, and those with a list to insert
    plain_ids bigint[] := '{}';
    plain_tokens bigint[] := '{}';
    plain_results jsonb[] := '{}';
    plain_progress jsonb[] := '{}';
    listed_ids bigint[] := '{}';
    listed_tokens bigint[] := '{}';
    listed_results jsonb[] := '{}';
    listed_progress jsonb[] := '{}';
    listed_follow_ups jsonb[] := '{}';
    done_ids bigint[];
    inserted bigint[];
    job record;
    why text;
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM @schema@.fenced_refuse('completing jobs with follow-ups', problem);
    END IF;
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    FOR job IN
        SELECT * FROM unnest(jobs_complete_with_follow_ups.ids,
                             jobs_complete_with_follow_ups.tokens,
                             jobs_complete_with_follow_ups.results,
                             jobs_complete_with_follow_ups.progress,
                             jobs_complete_with_follow_ups.follow_ups)
                 AS d(id, token, result, progress, follow_ups)
    LOOP
        IF job.follow_ups IS NULL OR job.follow_ups = '[]'::jsonb THEN
            plain_ids := plain_ids || job.id;
            plain_tokens := plain_tokens || job.token;
            plain_results := plain_results || job.result;
            plain_progress := plain_progress || job.progress;
        ELSIF jsonb_typeof(job.follow_ups) <> 'array'
              OR jsonb_array_length(job.follow_ups) > 1000 THEN
            -- refused as it is; only the holder learns why (a non-holder: no row)
            RETURN QUERY
            SELECT j.id, NULL::bigint[],
                   'follow-ups refused: ' || CASE
                       WHEN jsonb_typeof(job.follow_ups) <> 'array' THEN
                           'follow-ups must be a JSON array of job objects, not a JSON '
                           || jsonb_typeof(job.follow_ups)
                       ELSE 'at most 1000 follow-ups per job, not '
                            || jsonb_array_length(job.follow_ups) END
              FROM @schema@.jobs j
             WHERE j.id = job.id AND j.lease_token = job.token
               AND j.locked_by = jobs_complete_with_follow_ups.worker
               AND j.status::text = 'running';
        ELSE
            listed_ids := listed_ids || job.id;
            listed_tokens := listed_tokens || job.token;
            listed_results := listed_results || job.result;
            listed_progress := listed_progress || job.progress;
            listed_follow_ups := listed_follow_ups || job.follow_ups;
        END IF;
    END LOOP;

    IF cardinality(listed_ids) > 0 THEN
        -- All lists at once: one completion, one enqueue_many_v3, one insert. In a
        -- subtransaction: if enqueue (or a bound) refuses a job of any list, none of this
        -- stays, and each job is tried alone below, so only the bad list's job is refused.
        -- A list whose jobs wait for each other (after_index: positions in its own list)
        -- is never joined to another: each job is tried alone below.
        IF EXISTS (SELECT FROM unnest(listed_follow_ups) AS l(follow_ups)
                    CROSS JOIN LATERAL jsonb_array_elements(l.follow_ups) AS e(spec)
                    WHERE jsonb_typeof(e.spec) = 'object' AND e.spec ? 'after_index') THEN
            done_ids := NULL;
        ELSE
        BEGIN
            done_ids := ARRAY(
                SELECT c.id FROM @schema@.complete_jobs(
                    jobs_complete_with_follow_ups.worker, listed_ids, listed_tokens,
                    listed_results, listed_progress) AS c(id));
            IF cardinality(done_ids) > 0 THEN  -- (the others lost their lease: nothing)
                inserted := @schema@.enqueue_many_v3((
                    SELECT jsonb_agg(e.spec ORDER BY l.n, e.k)
                      FROM unnest(listed_ids, listed_follow_ups) WITH ORDINALITY
                           AS l(id, follow_ups, n)
                     CROSS JOIN LATERAL jsonb_array_elements(l.follow_ups) WITH ORDINALITY
                           AS e(spec, k)
                     WHERE l.id = ANY(done_ids)));
                INSERT INTO @schema@.job_follow_ups (job_id, position, follow_up_id)
                SELECT s.id, s.k, inserted[s.r]
                  FROM (SELECT l.id, e.k, row_number() OVER (ORDER BY l.n, e.k) AS r
                          FROM unnest(listed_ids, listed_follow_ups) WITH ORDINALITY
                               AS l(id, follow_ups, n)
                         CROSS JOIN LATERAL jsonb_array_elements(l.follow_ups)
                               WITH ORDINALITY AS e(spec, k)
                         WHERE l.id = ANY(done_ids)) s;
            END IF;
        EXCEPTION
            WHEN data_exception OR integrity_constraint_violation
                 OR insufficient_privilege OR serialization_failure THEN
                done_ids := NULL;
        END;
        END IF;
        IF done_ids IS NOT NULL THEN
            RETURN QUERY
            SELECT f.job_id, array_agg(f.follow_up_id ORDER BY f.position), NULL::text
              FROM @schema@.job_follow_ups f
             WHERE f.job_id = ANY(done_ids)
             GROUP BY f.job_id;
        ELSE
            FOR job IN
                SELECT * FROM unnest(listed_ids, listed_tokens, listed_results,
                                     listed_progress, listed_follow_ups)
                         AS d(id, token, result, progress, follow_ups)
            LOOP
                why := NULL;
                BEGIN
                    IF EXISTS (SELECT FROM @schema@.complete_jobs(
                                   jobs_complete_with_follow_ups.worker, ARRAY[job.id],
                                   ARRAY[job.token], ARRAY[job.result],
                                   ARRAY[job.progress])) THEN
                        inserted := @schema@.enqueue_many_v3(job.follow_ups);
                        INSERT INTO @schema@.job_follow_ups (job_id, position, follow_up_id)
                        SELECT job.id, f.n, f.follow_up_id
                          FROM unnest(inserted) WITH ORDINALITY AS f(follow_up_id, n);
                        RETURN QUERY SELECT job.id, inserted, NULL::text;
                    END IF;  -- (else the lease was lost: nothing changed, no row)
                EXCEPTION
                    WHEN data_exception OR integrity_constraint_violation
                         OR insufficient_privilege OR serialization_failure THEN
                        why := SQLERRM;
                END;
                IF why IS NOT NULL THEN
                    -- still ours (only the holder learns why)
                    RETURN QUERY
                    SELECT j.id, NULL::bigint[], left('follow-ups refused: ' || why, 2000)
                      FROM @schema@.jobs j
                     WHERE j.id = job.id AND j.lease_token = job.token
                       AND j.locked_by = jobs_complete_with_follow_ups.worker
                       AND j.status::text = 'running';
                END IF;
            END LOOP;
        END IF;
    END IF;

    IF cardinality(plain_ids) > 0 THEN
        RETURN QUERY
        SELECT c.id, NULL::bigint[], NULL::text
          FROM @schema@.complete_jobs(jobs_complete_with_follow_ups.worker, plain_ids,
                                      plain_tokens, plain_results, plain_progress) AS c(id);
    END IF;
END;
$$;

-- complete with follow-ups for one job (other languages): jobs_complete_with_follow_ups
-- for one job. One row if the lease held: follow_up_ids (completed), or refused (why the
-- follow-ups were refused: the job is still running and held; record the attempt as
-- failed, fail_job, saying why). No row: the lease was lost, nothing changed.
CREATE FUNCTION @schema@.job_complete_with_follow_ups(
    job_id bigint, worker text, token bigint, result jsonb, follow_ups jsonb,
    progress jsonb DEFAULT NULL)
RETURNS TABLE (follow_up_ids bigint[], refused text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text := @schema@.fenced_job_problem(job_complete_with_follow_ups.worker,
                                                job_complete_with_follow_ups.job_id,
                                                job_complete_with_follow_ups.token);
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM @schema@.fenced_refuse('completing a job with follow-ups', problem);
    END IF;
    RETURN QUERY
    SELECT c.follow_up_ids, c.refused
      FROM @schema@.jobs_complete_with_follow_ups(
               job_complete_with_follow_ups.worker, ARRAY[job_complete_with_follow_ups.job_id],
               ARRAY[job_complete_with_follow_ups.token],
               ARRAY[job_complete_with_follow_ups.result],
               ARRAY[job_complete_with_follow_ups.progress],
               ARRAY[job_complete_with_follow_ups.follow_ups]) c;
END;
$$;

-- The lease in the handler's hands: an application calls this in its own transaction
-- (with the job's id and the handler's job.lease_token) to make its writes conditional on
-- the job still running under that token, its lease not run out. Raises SQLSTATE PGWL1
-- (the class PG is not PostgreSQL's: pgworkerd's own) when it is not, so the
-- application's transaction rolls back; 22023 for NULL arguments. Otherwise it holds the
-- job's row FOR KEY SHARE until that transaction ends: a rescue (the claim's FOR UPDATE
-- SKIP LOCKED, its burial of an expired lease) skips the row meanwhile, so no one takes
-- the lease before the application commits or rolls back, while the holder's own renewals
-- and finish (no-key updates) go on unblocked. (FOR SHARE would block them: the daemon
-- renews all its leases in one statement, so one application transaction would stall
-- every lease of its host; bench/follow_ups_bench.py measures both.) An operator's
-- cancel waits for the application's transaction (it locks FOR UPDATE). The token is a
-- capability: the error never shows it.
CREATE FUNCTION @schema@.job_lease_assert(job_id bigint, token bigint)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF job_lease_assert.job_id IS NULL OR job_lease_assert.token IS NULL THEN
        PERFORM @schema@.fenced_refuse('asserting a lease',
            'job_id and token must be the job''s id and the lease_token its handler was '
            || 'given, not NULL');
    END IF;
    PERFORM FROM @schema@.jobs j
     WHERE j.id = job_lease_assert.job_id AND j.lease_token = job_lease_assert.token
       AND j.status::text = 'running' AND j.locked_until > clock_timestamp()
       FOR KEY SHARE OF j;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgworkerd: job % is not running under this lease (it ran out, was '
                        'taken by another attempt, or the job finished): this transaction '
                        'must not commit', job_lease_assert.job_id
            USING ERRCODE = 'PGWL1',
                  HINT = 'Roll back: another attempt of the job may be running, or have run.';
    END IF;
END;
$$;

REVOKE EXECUTE ON FUNCTION
    @schema@.jobs_complete_with_follow_ups(text, bigint[], bigint[], jsonb[], jsonb[], jsonb[]),
    @schema@.job_complete_with_follow_ups(bigint, text, bigint, jsonb, jsonb, jsonb),
    @schema@.job_lease_assert(bigint, bigint)
    FROM PUBLIC;

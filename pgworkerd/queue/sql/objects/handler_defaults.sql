-- Per-handler defaults of the enqueue (0037, issue 25 item 3; docs/guide/enqueue.md
-- "Dedupe"): what an enqueue that names no dedupe_policy does when its dedupe key is held.

-- One row per handler with a default dedupe policy. The enqueuer does not read the
-- daemons' config, so an operator writes the row (handler_default_set, which checks every
-- value: deploy/roles.sql lets pgworkerd_operator call it and pgworkerd_reader read the
-- table). enqueue_many_v3 (so enqueue_v4, the Python API and the CLI, which send every
-- job with a dedupe key through it) reads it for its dedupe hits only, and only for a job
-- that names no policy: a policy given with the enqueue wins, "existing" included. The
-- default decides what a hit does (reject, or move the pending holder's run time); the new
-- job's own run time is what its enqueue says (a debounce default does not delay the
-- first job of a key: give it a delay). The older enqueue functions (enqueue, enqueue_v2,
-- enqueue_many, enqueue_many_v2) keep their contract and return the holder's id.
CREATE TABLE @schema@.handler_defaults (
    handler              text PRIMARY KEY
        CONSTRAINT handler_defaults_handler_name CHECK (@schema@.enqueue_name_ok(handler)),
    dedupe_policy        text NOT NULL
        CONSTRAINT handler_defaults_dedupe_policy
        CHECK (dedupe_policy IN ('existing', 'reject', 'debounce')),
    debounce_seconds     double precision,
    debounce_max_seconds double precision,
    set_by               text NOT NULL DEFAULT session_user,
    set_at               timestamptz NOT NULL DEFAULT now(),
    -- debounce and debounce_max with "debounce" only, and then both, as per enqueue
    CONSTRAINT handler_defaults_debounce
        CHECK ((dedupe_policy = 'debounce') = (debounce_seconds IS NOT NULL)
               AND (debounce_seconds IS NULL) = (debounce_max_seconds IS NULL)
               AND debounce_seconds > 0
               AND debounce_max_seconds BETWEEN debounce_seconds AND 31536000)
);

-- Set a handler's default dedupe policy ("existing", "reject" or "debounce" with its
-- debounce and debounce_max, held to the enqueue's own bounds and messages:
-- job_extras_problem), or remove it (dedupe_policy NULL). A bad value raises 22023 naming
-- it and changes nothing. Returns whether a row is there afterwards.
CREATE FUNCTION @schema@.handler_default_set(
    handler text,
    dedupe_policy text,
    debounce interval DEFAULT NULL,
    debounce_max interval DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET intervalstyle = 'postgres'
AS $$
DECLARE
    job jsonb;
    problem text;
BEGIN
    IF handler_default_set.handler IS NULL
       OR NOT @schema@.enqueue_name_ok(handler_default_set.handler) THEN
        RAISE EXCEPTION 'pgworkerd: a handler name is 1 to 128 printable characters without '
                        'whitespace at either end, not %',
                        coalesce(quote_literal(left(handler_default_set.handler, 140)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF handler_default_set.dedupe_policy IS NULL THEN
        IF handler_default_set.debounce IS NOT NULL
           OR handler_default_set.debounce_max IS NOT NULL THEN
            RAISE EXCEPTION 'pgworkerd: handler %: debounce and debounce_max go with '
                            'dedupe_policy "debounce" (NULL removes the default)',
                            handler_default_set.handler
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        DELETE FROM @schema@.handler_defaults d WHERE d.handler = handler_default_set.handler;
        RETURN false;
    END IF;
    -- the enqueue's own checks, on the job object an enqueue with this policy would carry
    job := jsonb_strip_nulls(jsonb_build_object(
        'dedupe_key', 'k', 'dedupe_policy', handler_default_set.dedupe_policy,
        'debounce', handler_default_set.debounce::text,
        'debounce_max', handler_default_set.debounce_max::text));
    problem := @schema@.job_extras_problem(job, 1, jsonb_build_array(job));
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgworkerd: handler %: %', handler_default_set.handler, problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO @schema@.handler_defaults AS d
        (handler, dedupe_policy, debounce_seconds, debounce_max_seconds)
    VALUES (handler_default_set.handler, handler_default_set.dedupe_policy,
            @schema@.job_duration_seconds(job->'debounce'),
            @schema@.job_duration_seconds(job->'debounce_max'))
    ON CONFLICT ON CONSTRAINT handler_defaults_pkey DO UPDATE
        SET dedupe_policy = excluded.dedupe_policy,
            debounce_seconds = excluded.debounce_seconds,
            debounce_max_seconds = excluded.debounce_max_seconds,
            set_by = session_user, set_at = now();
    RETURN true;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.handler_default_set(text, text, interval, interval)
    FROM PUBLIC;

-- Claiming jobs: claim_jobs, the stable claim of workers in any language, its successors
-- claim_jobs_v2 and claim_jobs_v3 (the daemon's, queries job_claim), all over claim_v3,
-- their one implementation. The older claims (claim, claim_v2) are in compat.sql.

-- claim_v3: claim_v2 plus fleet-wide limits and pauses. Since 0019 the implementation
-- behind claim_jobs, which new code calls (its COMMENT says who still calls it directly),
-- and since 0043 behind claim_jobs_v3 when no handler is fair or rate-limited.
--   SELECT * FROM pgworkerd.claim_v3('worker-1', '{default,mail}', '{send_mail,export}',
--                                    '{300,60}', '{4,4}', 8, NULL, NULL,
--                                    '{NULL,10}', '{NULL,2}');
-- max_running: per handler, at most this many current leases across the fleet (NULL: no
-- limit). max_running_per_key: per handler, at most this many current leases per
-- concurrency key (NULL: no limit; jobs without a key are not limited by it).
--
-- Why counting alone is not enough: two daemons claiming at once each count the same
-- committed leases, each see room for one more, and both take it (SKIP LOCKED makes them
-- skip each other's rows, not each other's counts). So a claim that applies a limit first
-- takes a transaction-level advisory lock per limited handler, keyed on (schema,
-- handler), in one fixed order (sorted by name in the "C" collation, so two claims never
-- wait for each other crosswise: no deadlock), in a statement of its own BEFORE the
-- statement that counts: in this VOLATILE function every statement takes a new snapshot
-- (READ COMMITTED), so the count sees every claim committed before the lock was granted,
-- and the claim that held the lock has committed (locks are released after the commit is
-- visible). A lock taken inside the counting statement would be granted after that
-- statement's snapshot was taken, and the count could miss the claim it waited for.
-- Handlers without limits take no lock: their claims pay one empty CTE and nothing else.
--
-- Each claim applies its own caller's limits: two daemons configured with different
-- limits for one handler each hold the fleet to their own number when they claim (a
-- daemon with no limit for it takes no lock and counts nothing). Release 0.2 daemons
-- (claim()) and daemons of schema 8 (claim_v2) know no limits and no pauses.
CREATE FUNCTION @schema@.claim_v3(
    worker text,
    queues text[],
    handlers text[],
    lease_seconds float8[],         -- per handler: the lease a claimed job gets
    free integer[],                 -- per handler: how many more jobs it may take here
    max_jobs integer,               -- in all
    handler_max_attempts integer[] DEFAULT NULL,  -- per handler: overrides the job's own
    -- per handler: a JSON array of the queues (among `queues`) it claims from, or null
    -- for all of them; the whole argument NULL: every handler claims from all of them
    handler_queues jsonb DEFAULT NULL,
    max_running integer[] DEFAULT NULL,          -- per handler: fleet-wide, or NULL
    max_running_per_key integer[] DEFAULT NULL   -- per handler: per key, or NULL
)
RETURNS TABLE (
    id bigint, queue text, handler text, payload jsonb, priority integer, attempts integer,
    max_attempts integer, lease_token bigint, checkpoint jsonb, run_at timestamptz,
    created_at timestamptz, locked_until timestamptz, rescued boolean
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- SECURITY INVOKER: a caller needs UPDATE on the jobs table and SELECT on paused, so
-- EXECUTE can stay granted to everyone. claim_jobs (SECURITY DEFINER) has both; the
-- daemon role has no UPDATE on jobs since roles.sql of schema 22, so it claims through
-- claim_jobs.
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    limited text;
    -- handlers with a per-key limit in this call: they may need a second pass
    keyed text[] := ARRAY(SELECT s.h FROM unnest(claim_v3.handlers, claim_v3.max_running_per_key)
                                            AS s(h, k) WHERE s.k IS NOT NULL);
    taken text[] := '{}';  -- the handler of each job claimed by the passes so far
    jobs_left integer := claim_v3.max_jobs;
    got bigint;
    pass integer := 0;
BEGIN
    -- The locks: one statement, before the one that counts (see above). FOR ... LOOP
    -- takes them one by one in the order of the sorted query.
    FOR limited IN
        SELECT DISTINCT s.h COLLATE "C"
          FROM unnest(claim_v3.handlers, claim_v3.max_running, claim_v3.max_running_per_key)
               AS s(h, m, k)
         WHERE (s.m IS NOT NULL OR s.k IS NOT NULL)
         ORDER BY 1
    LOOP
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            -- one snapshot for the whole transaction: the count could not see the claims
            -- committed while this one waited for the lock
            RAISE EXCEPTION 'pgworkerd: claim_v3 with limits needs READ COMMITTED, not %',
                current_setting('transaction_isolation')
                USING ERRCODE = 'invalid_transaction_state';
        END IF;
        PERFORM pg_advisory_xact_lock(hashtext(@schema_literal@ || '.max_running'),
                                      hashtext(limited));
    END LOOP;

    -- claim_v2's statement (see 0006 for its plan), plus: `room` per handler (its free
    -- slots here, capped by what its fleet-wide limit leaves), the keys that are full
    -- (filtered out of the candidates, so a full key's backlog never takes the place of
    -- other keys' jobs in a batch), the per-key ranking that keeps one batch within what
    -- each key has left, and the paused queues and handlers left out altogether.
    --
    -- Why more than one pass: the candidates of a handler are its best `room` pending
    -- jobs that are not of a full key, and the per-key ranking then keeps at most what
    -- each key has left. When the best jobs are mostly of one key that has room for
    -- only some of them, the batch comes out short although jobs of other keys wait.
    -- The keys it filled are full for the next pass (this transaction sees its own
    -- claims), which then takes the others. Only handlers with a per-key limit ever
    -- need it, and only while a pass still claims something.
    LOOP
    pass := pass + 1;
    RETURN QUERY
    WITH wanted AS (
        SELECT s.handler, s.lease_seconds,
               -- what earlier passes took of this daemon's free slots
               s.free - coalesce(cardinality(array_positions(taken, s.handler)), 0) AS free,
               s.max_attempts,
               s.max_running, s.per_key,
               CASE WHEN jsonb_typeof((SELECT claim_v3.handler_queues) -> (s.n::integer - 1))
                         = 'array'
                    THEN ARRAY(SELECT jsonb_array_elements_text(
                                   (SELECT claim_v3.handler_queues) -> (s.n::integer - 1)))
               END AS queues
        FROM unnest((SELECT claim_v3.handlers), (SELECT claim_v3.lease_seconds),
                    (SELECT claim_v3.free), (SELECT claim_v3.handler_max_attempts),
                    (SELECT claim_v3.max_running), (SELECT claim_v3.max_running_per_key))
             WITH ORDINALITY AS s(handler, lease_seconds, free, max_attempts, max_running,
                                  per_key, n)
        WHERE NOT EXISTS (SELECT 1 FROM @schema@.paused p
                           WHERE p.kind = 'handler' AND p.name = s.handler)
    ), open_queues AS (
        SELECT ARRAY(SELECT q FROM unnest((SELECT claim_v3.queues)::text[]) AS q
                      WHERE NOT EXISTS (SELECT 1 FROM @schema@.paused p
                                         WHERE p.kind = 'queue' AND p.name = q)) AS queues
    ), key_used AS (
        -- current leases per key of the handlers with a per-key limit
        SELECT s.handler, k.concurrency_key, k.n
        FROM wanted s CROSS JOIN LATERAL (
            SELECT r.concurrency_key, count(*) AS n FROM @schema@.jobs r
            WHERE r.status = 'running' AND r.handler = s.handler
              AND r.concurrency_key IS NOT NULL AND r.locked_until > now()
            GROUP BY r.concurrency_key) k
        WHERE s.per_key IS NOT NULL
    ), served AS (
        SELECT s.handler, s.lease_seconds, s.max_attempts, s.queues, s.per_key,
               CASE WHEN s.max_running IS NULL THEN s.free
                    ELSE least(s.free, s.max_running - (
                        SELECT count(*) FROM @schema@.jobs r
                        WHERE r.status = 'running' AND r.handler = s.handler
                          AND r.locked_until > now())::integer) END AS room,
               CASE WHEN s.per_key IS NOT NULL
                    THEN ARRAY(SELECT k.concurrency_key FROM key_used k
                                WHERE k.handler = s.handler AND k.n >= s.per_key) END
                   AS full_keys
        FROM wanted s
        -- a drain takes effect at once, even before the daemon's next heartbeat reads it
        WHERE NOT EXISTS (SELECT 1 FROM @schema@.workers w
                           WHERE w.id = (SELECT claim_v3.worker) AND w.drain_requested)
    ), due AS (
        -- per handler, so a capped handler's backlog cannot hide another handler's jobs;
        -- a handler at its limit has no room and is not looked at
        SELECT d.id, d.priority, d.run_at, d.concurrency_key, s.handler
        FROM served s CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_at, j.concurrency_key FROM @schema@.jobs j
            WHERE j.status = 'pending' AND j.run_at <= now() AND j.handler = s.handler
              AND j.queue = ANY((SELECT o.queues FROM open_queues o)::text[])
              AND (s.queues IS NULL OR j.queue = ANY(s.queues))
              AND (s.full_keys IS NULL OR j.concurrency_key IS NULL
                   OR j.concurrency_key <> ALL(s.full_keys))
            ORDER BY j.priority, j.run_at, j.id
            LIMIT greatest(0, least(s.room, (SELECT jobs_left)))
            FOR UPDATE SKIP LOCKED) d
        WHERE s.room > 0
    ), expired AS (
        -- Paused queues and handlers are left out here too: their expired jobs are neither
        -- run again nor buried while paused (they stop counting against limits, their
        -- leases being over), and the first claim after the resume rescues them.
        SELECT j.id, j.priority, j.run_at, j.handler, j.concurrency_key,
               (j.attempts >= j.max_attempts OR j.cancel_requested) AS finished
        FROM @schema@.jobs j
        WHERE j.status = 'running' AND j.locked_until < now()
          AND j.queue = ANY((SELECT o.queues FROM open_queues o)::text[])
          AND EXISTS (SELECT 1 FROM served s
                       WHERE s.handler = j.handler AND s.room > 0
                         AND (s.queues IS NULL OR j.queue = ANY(s.queues))
                         AND (s.full_keys IS NULL OR j.concurrency_key IS NULL
                              OR j.concurrency_key <> ALL(s.full_keys)))
        ORDER BY j.locked_until
        LIMIT (SELECT jobs_left)
        FOR UPDATE SKIP LOCKED
    ), buried AS (
        UPDATE @schema@.jobs j
           SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                             ELSE 'dead' END::@schema@.job_status,
               last_error = 'lease of ' || j.locked_by || ' expired during attempt '
                            || j.attempts || ' of ' || j.max_attempts || ': the worker was lost',
               locked_by = NULL, locked_until = NULL, finished_at = now(), updated_at = now(),
               -- a fencing event like a claim: the lost holder's token no longer matches
               lease_token = j.lease_token + 1
          FROM expired e
         -- (0043) by primary key from `expired`, as the claim's UPDATE below: planned
         -- while the jobs table was empty, a join read every job at every claim
         WHERE j.id = ANY(ARRAY(SELECT x.id FROM expired x WHERE x.finished))
           AND j.id = e.id AND e.finished
        RETURNING j.id
    ), candidates AS (
        SELECT id, priority, run_at, handler, concurrency_key, false AS rescued FROM due
        UNION ALL
        SELECT id, priority, run_at, handler, concurrency_key, true FROM expired
        WHERE NOT finished
    ), within_keys AS (
        -- at most what each key has left (per_key minus its current leases), the best
        -- first; jobs without a key and handlers without a per-key limit all pass
        SELECT c.id, c.priority, c.run_at, c.handler, c.rescued FROM (
            SELECT c.*, s.per_key,
                   row_number() OVER (PARTITION BY c.handler, c.concurrency_key
                                      ORDER BY c.priority, c.run_at, c.id) AS nk
            FROM candidates c JOIN served s USING (handler)) c
        WHERE c.per_key IS NULL OR c.concurrency_key IS NULL
           OR c.nk <= c.per_key - coalesce((SELECT k.n FROM key_used k
                                             WHERE k.handler = c.handler
                                               AND k.concurrency_key = c.concurrency_key), 0)
    ), chosen AS (
        -- at most `room` per handler, the best first; due and expired jobs carry what the
        -- ranking needs, so the table is not read again here
        SELECT id, rescued, lease_seconds, max_attempts FROM (
            SELECT c.id, c.priority, c.run_at, c.rescued, s.room, s.lease_seconds,
                   s.max_attempts,
                   row_number() OVER (PARTITION BY c.handler
                                      ORDER BY c.priority, c.run_at, c.id) AS n
            FROM within_keys c JOIN served s USING (handler)) ranked
        WHERE n <= room
        ORDER BY priority, run_at, id
        LIMIT (SELECT jobs_left)
    )
    UPDATE @schema@.jobs j
       SET status = 'running',
           locked_by = claim_v3.worker,
           locked_until = now() + make_interval(secs => c.lease_seconds),
           attempts = j.attempts + 1,
           -- a handler's configured max_attempts overrides the job's own
           max_attempts = greatest(j.attempts + 1, coalesce(c.max_attempts, j.max_attempts)),
           lease_token = j.lease_token + 1,
           last_error = CASE WHEN j.status = 'running'
                             THEN 'lease of ' || j.locked_by || ' expired during attempt '
                                  || j.attempts || ': the worker was lost'
                             ELSE j.last_error END,
           started_at = now(),
           updated_at = now()
      FROM chosen c
     -- by primary key, however many rows a generic plan expects
     WHERE j.id = ANY(ARRAY(SELECT id FROM chosen)) AND j.id = c.id
    RETURNING j.id, j.queue, j.handler, j.payload, j.priority, j.attempts, j.max_attempts,
              j.lease_token, j.checkpoint, j.run_at, j.created_at, j.locked_until,
              c.rescued AS rescued;
    GET DIAGNOSTICS got = ROW_COUNT;
    jobs_left := jobs_left - got::integer;
    EXIT WHEN got = 0 OR jobs_left <= 0 OR cardinality(keyed) = 0 OR pass >= 4;
    -- Which handlers this transaction's passes claimed for: its own claims (this
    -- worker's, started at this transaction's now()).
    taken := ARRAY(SELECT j.handler FROM @schema@.jobs j
                    WHERE j.status = 'running' AND j.handler = ANY(claim_v3.handlers)
                      AND j.locked_by = claim_v3.worker AND j.started_at = now());
    END LOOP;
END;
$$;

COMMENT ON FUNCTION @schema@.claim_v3(text, text[], text[], float8[], integer[], integer,
                                      integer[], jsonb, integer[], integer[]) IS
    'The implementation behind claim_jobs. Called directly only by daemons built from '
    'schemas 9 to 18 (unreleased code before schema 19), during a rolling upgrade. New '
    'code calls claim_jobs (checked arguments, a durable commit).';

-- claim_v4 (0033, issue 25 items 1 and 2): claim_v3 plus fair share and start-rate
-- limits, per handler (each argument NULL, or one element per handler in the order of
-- `handlers`; all NULL: claim_v3's behaviour exactly). claim_jobs_v3 calls it when a
-- handler is fair or rate-limited (since 0043; claim_v3 otherwise, which costs less).
--   SELECT * FROM pgworkerd.claim_v4('worker-1', '{default}', '{export}', '{300}', '{4}', 4,
--                                    fair => '{true}', fair_weights => '[{"big": 3}]',
--                                    rate => '{0.333}', rate_per_key => '{NULL}');
-- fair: the handler's due jobs are served by concurrency key in turn (round robin over
--   the keys with due jobs, in index order, from where the last claim stopped: fair_cursors),
--   each key taking up to its weight per turn (fair_weights: per handler a JSON object
--   {key: integer 1..1000}, other keys 1). Jobs without a key take their turn as one key.
--   Within priorities: the most urgent level with due jobs is served in turns first; a
--   level's round that finds nothing moves to the next. Work-conserving: a key without
--   due jobs (or full, or waiting for its rate token) loses its turn, never a slot. The
--   cost is bounded by the keys visited, not by how many keys exist: at most
--   4 * room + 32 probes of jobs_pending_fair_idx per handler and claim; should they run
--   out (many keys whose jobs are all scheduled later, or full), the rest of the room is
--   filled in claim_v3's order (priority, run_at, id), so no slot idles.
-- rate, rate_per_key: starts per second, for the handler and per concurrency key (jobs
--   without a key are not limited by rate_per_key). A token bucket of one token per
--   handler or key (rate_buckets): one start when its token is due, the next 1/rate
--   later. The debit is in the claiming statement, so it commits with the claim: exact
--   across daemons (the handler's advisory lock, as for max_running) and across crashes.
--   An expired lease's rescue is a start like any other.
CREATE FUNCTION @schema@.claim_v4(
    worker text,
    queues text[],
    handlers text[],
    lease_seconds float8[],
    free integer[],
    max_jobs integer,
    handler_max_attempts integer[] DEFAULT NULL,
    handler_queues jsonb DEFAULT NULL,
    max_running integer[] DEFAULT NULL,
    max_running_per_key integer[] DEFAULT NULL,
    fair boolean[] DEFAULT NULL,      -- per handler: served in turns by key
    fair_weights jsonb DEFAULT NULL,  -- per handler: null or {key: turn size 1..1000}
    rate float8[] DEFAULT NULL,       -- per handler: starts per second, or NULL
    rate_per_key float8[] DEFAULT NULL  -- per handler: starts per second per key, or NULL
)
RETURNS TABLE (
    id bigint, queue text, handler text, payload jsonb, priority integer, attempts integer,
    max_attempts integer, lease_token bigint, checkpoint jsonb, run_at timestamptz,
    created_at timestamptz, locked_until timestamptz, rescued boolean
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- SECURITY INVOKER, as claim_v3; its caller (claim_jobs_v3, SECURITY DEFINER) also
-- writes rate_buckets and fair_cursors.
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    n integer := coalesce(cardinality(claim_v4.handlers), 0);
    limited text;
    -- handlers with a per-key limit or rate in this call: they may need a second pass
    keyed text[] := ARRAY(SELECT s.h FROM unnest(claim_v4.handlers, claim_v4.max_running_per_key,
                                                 claim_v4.rate_per_key) AS s(h, k, r)
                           WHERE s.k IS NOT NULL OR s.r IS NOT NULL);
    taken text[] := '{}';  -- the handler of each job claimed by the passes so far
    jobs_left integer := claim_v4.max_jobs;
    got bigint;
    pass integer := 0;
    problem text;
    -- the fair picks of a pass: their ids, and per handler how many jobs claim_v3's
    -- order may add (NULL: as many as its room; a fair handler: what its turns left)
    fair_ids bigint[];
    fill integer[];
    i integer;
    h text;
    open_q text[];
    h_queues text[];
    room integer;
    picked integer;
    probes integer;
    budget integer;
    level integer;
    cur_key text;
    cur_used integer;
    k text;
    weight integer;
    take integer;
    ids bigint[];
    round_got integer;
    round_start text;
    staying boolean;
    wrapped boolean;
BEGIN
    -- The new arguments are checked here (claim_v3's are checked by claim_jobs and
    -- claim_jobs_v3): plain expressions, no executor for a claim without them.
    problem := CASE
        WHEN claim_v4.fair IS NOT NULL
             AND (array_ndims(claim_v4.fair) > 1 OR cardinality(claim_v4.fair) <> n) THEN
            'fair must be NULL, or one per handler in the order of handlers, not '
            || left(claim_v4.fair::text, 200)
        WHEN claim_v4.fair_weights IS NOT NULL
             AND (jsonb_typeof(claim_v4.fair_weights) <> 'array'
                  OR jsonb_array_length(claim_v4.fair_weights) <> n
                  OR jsonb_path_exists(claim_v4.fair_weights,
                                       'strict $[*] ? (@.type() != "null" && @.type() != "object")')
                  OR jsonb_path_exists(claim_v4.fair_weights,
                                       'strict $[*] ? (@.type() == "object").* ? (@.type() != "number" || @ < 1 || @ > 1000 || @ != @.floor())'))
             THEN
            'fair_weights must be NULL, or a JSON array with one element per handler in the '
            || 'order of handlers, each null or an object of concurrency keys and whole '
            || 'numbers from 1 to 1000 (jobs per turn), not '
            || left(claim_v4.fair_weights::text, 200)
        WHEN claim_v4.rate IS NOT NULL
             AND (array_ndims(claim_v4.rate) > 1 OR cardinality(claim_v4.rate) <> n
                  -- NaN is above every number: refused by the second test
                  OR (0 < ALL(claim_v4.rate) AND 1000000 >= ALL(claim_v4.rate)) IS FALSE) THEN
            'rate must be NULL, or one per handler in the order of handlers, each NULL (no '
            || 'limit) or starts per second above 0 and at most 1000000, not '
            || left(claim_v4.rate::text, 200)
        WHEN claim_v4.rate_per_key IS NOT NULL
             AND (array_ndims(claim_v4.rate_per_key) > 1
                  OR cardinality(claim_v4.rate_per_key) <> n
                  OR (0 < ALL(claim_v4.rate_per_key)
                      AND 1000000 >= ALL(claim_v4.rate_per_key)) IS FALSE) THEN
            'rate_per_key must be NULL, or one per handler in the order of handlers, each '
            || 'NULL (no limit) or starts per second above 0 and at most 1000000, not '
            || left(claim_v4.rate_per_key::text, 200)
    END;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgworkerd: claim_v4: %', problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The locks, as claim_v3's (see its header), for fair and rate-limited handlers too:
    -- their cursors and buckets are read, then written, by one claim at a time.
    FOR limited IN
        SELECT DISTINCT s.h COLLATE "C"
          FROM unnest(claim_v4.handlers, claim_v4.max_running, claim_v4.max_running_per_key,
                      claim_v4.fair, claim_v4.rate, claim_v4.rate_per_key)
               AS s(h, m, k, f, r, rk)
         WHERE (s.m IS NOT NULL OR s.k IS NOT NULL OR s.f OR s.r IS NOT NULL
                OR s.rk IS NOT NULL)
         ORDER BY 1
    LOOP
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'pgworkerd: claim_v4 with limits needs READ COMMITTED, not %',
                current_setting('transaction_isolation')
                USING ERRCODE = 'invalid_transaction_state';
        END IF;
        PERFORM pg_advisory_xact_lock(hashtext(@schema_literal@ || '.max_running'),
                                      hashtext(limited));
    END LOOP;

    IF claim_v4.rate IS NOT NULL OR claim_v4.rate_per_key IS NOT NULL THEN
        -- Buckets whose token is due mean what no row means: forget some (this claim
        -- holds the locks of their handlers), so the table stays the size of the recent
        -- starts whatever the number of keys.
        DELETE FROM @schema@.rate_buckets b
         WHERE b.ctid = ANY(ARRAY(
                   SELECT o.ctid FROM @schema@.rate_buckets o
                    WHERE o.handler = ANY(ARRAY(
                              SELECT s.h FROM unnest(claim_v4.handlers, claim_v4.rate,
                                                     claim_v4.rate_per_key) AS s(h, r, rk)
                               WHERE s.r IS NOT NULL OR s.rk IS NOT NULL))
                      AND o.next_at <= now()
                    LIMIT 100))
           AND b.next_at <= now();
    END IF;

    LOOP
    pass := pass + 1;
    fair_ids := '{}';
    fill := NULL;
    IF true = ANY(claim_v4.fair) THEN
        open_q := ARRAY(SELECT q FROM unnest(claim_v4.queues) AS q
                         WHERE NOT EXISTS (SELECT 1 FROM @schema@.paused p
                                            WHERE p.kind = 'queue' AND p.name = q));
        fill := array_fill(NULL::integer, ARRAY[n]);
        FOR i IN 1 .. n LOOP
            CONTINUE WHEN claim_v4.fair[i] IS NOT TRUE;
            h := claim_v4.handlers[i];
            fill[i] := 0;
            -- the room of claim_v3's `served`, computed here for the turns
            room := least(jobs_left,
                          claim_v4.free[i] - coalesce(cardinality(array_positions(taken, h)), 0));
            IF claim_v4.max_running[i] IS NOT NULL THEN
                room := least(room, claim_v4.max_running[i] - (
                    SELECT count(*) FROM @schema@.jobs r
                     WHERE r.status = 'running' AND r.handler = h
                       AND r.locked_until > now())::integer);
            END IF;
            IF claim_v4.rate[i] IS NOT NULL THEN
                room := least(room, CASE WHEN EXISTS (
                    SELECT 1 FROM @schema@.rate_buckets b
                     WHERE b.handler = h AND b.concurrency_key = ''
                       AND b.next_at > now()) THEN 0 ELSE 1 END);
            END IF;
            CONTINUE WHEN room <= 0
                OR EXISTS (SELECT 1 FROM @schema@.paused p
                            WHERE p.kind = 'handler' AND p.name = h)
                OR EXISTS (SELECT 1 FROM @schema@.workers w
                            WHERE w.id = claim_v4.worker AND w.drain_requested);
            h_queues := CASE WHEN jsonb_typeof(claim_v4.handler_queues -> (i - 1)) = 'array'
                             THEN ARRAY(SELECT jsonb_array_elements_text(
                                            claim_v4.handler_queues -> (i - 1)))
                        END;
            SELECT c.concurrency_key, c.used INTO cur_key, cur_used
              FROM @schema@.fair_cursors c WHERE c.handler = h;
            picked := 0;
            probes := 0;
            budget := 4 * room + 32;
            level := NULL;
            -- the priority levels with due jobs, most urgent first (each probe a
            -- statement of its own, so that its plan uses the index whatever the values)
            <<levels>>
            LOOP
                IF level IS NULL THEN
                    SELECT j.priority INTO level FROM @schema@.jobs j
                     WHERE j.status = 'pending' AND j.handler = h AND j.run_at <= now()
                     ORDER BY j.priority LIMIT 1;
                ELSE
                    SELECT j.priority INTO level FROM @schema@.jobs j
                     WHERE j.status = 'pending' AND j.handler = h AND j.run_at <= now()
                       AND j.priority > level
                     ORDER BY j.priority LIMIT 1;
                END IF;
                EXIT levels WHEN NOT FOUND;
                probes := probes + 1;
                -- The turns at this level: the cursor's key finishes its turn, then each
                -- next key in order has one, round after round while a round finds jobs.
                k := cur_key;
                staying := cur_key IS NOT NULL;
                round_start := NULL;
                wrapped := false;
                round_got := 0;
                LOOP
                    EXIT levels WHEN picked >= room OR probes >= budget;
                    weight := coalesce((claim_v4.fair_weights -> (i - 1) ->> k)::integer, 1);
                    IF NOT (staying AND cur_used < weight) THEN
                        staying := false;
                        cur_used := 0;
                        IF k IS NULL THEN
                            SELECT coalesce(j.concurrency_key, '') INTO k FROM @schema@.jobs j
                             WHERE j.status = 'pending' AND j.handler = h AND j.priority = level
                             ORDER BY coalesce(j.concurrency_key, '') LIMIT 1;
                            probes := probes + 1;
                            EXIT WHEN NOT FOUND;  -- no key left at this level
                        ELSE
                            SELECT coalesce(j.concurrency_key, '') INTO k FROM @schema@.jobs j
                             WHERE j.status = 'pending' AND j.handler = h AND j.priority = level
                               AND coalesce(j.concurrency_key, '') > k
                             ORDER BY coalesce(j.concurrency_key, '') LIMIT 1;
                            probes := probes + 1;
                            IF NOT FOUND THEN
                                wrapped := true;  -- past the last key: on from the first
                                CONTINUE;  -- k is NULL now
                            END IF;
                        END IF;
                        IF round_start IS NULL THEN
                            round_start := k;
                        ELSIF wrapped AND k >= round_start THEN
                            -- a whole round: another one only if this one found jobs
                            EXIT WHEN round_got = 0;
                            round_got := 0;
                            wrapped := false;
                            round_start := k;
                        END IF;
                        weight := coalesce((claim_v4.fair_weights -> (i - 1) ->> k)::integer, 1);
                    END IF;
                    staying := false;
                    take := least(weight - cur_used, room - picked);
                    IF k <> '' AND claim_v4.max_running_per_key[i] IS NOT NULL THEN
                        take := least(take, claim_v4.max_running_per_key[i] - (
                            SELECT count(*) FROM @schema@.jobs r
                             WHERE r.status = 'running' AND r.handler = h
                               AND r.concurrency_key = k AND r.locked_until > now())::integer);
                    END IF;
                    IF k <> '' AND claim_v4.rate_per_key[i] IS NOT NULL THEN
                        take := least(take, CASE WHEN EXISTS (
                            SELECT 1 FROM @schema@.rate_buckets b
                             WHERE b.handler = h AND b.concurrency_key = k
                               AND b.next_at > now()) THEN 0 ELSE 1 END);
                    END IF;
                    ids := '{}';
                    IF take > 0 THEN
                        ids := ARRAY(
                            SELECT j.id FROM @schema@.jobs j
                             WHERE j.status = 'pending' AND j.handler = h
                               AND j.priority = level AND coalesce(j.concurrency_key, '') = k
                               AND j.run_at <= now() AND j.queue = ANY(open_q)
                               AND (h_queues IS NULL OR j.queue = ANY(h_queues))
                               -- this claim's picks, still pending, are locked by itself
                               AND j.id <> ALL(fair_ids)
                             ORDER BY j.run_at, j.id
                             LIMIT take
                               FOR UPDATE SKIP LOCKED);
                        probes := probes + 1;
                    END IF;
                    fair_ids := fair_ids || ids;
                    picked := picked + cardinality(ids);
                    round_got := round_got + cardinality(ids);
                    cur_key := k;
                    -- a key that had less than the rest of its turn has had its turn (a
                    -- pick cut short by the room keeps the rest for the next claim)
                    cur_used := CASE WHEN cardinality(ids) < weight - cur_used
                                          AND picked < room THEN weight
                                     ELSE cur_used + cardinality(ids) END;
                END LOOP;
            END LOOP;
            IF picked > 0 THEN  -- a claim that took nothing writes nothing
                INSERT INTO @schema@.fair_cursors AS c (handler, concurrency_key, used)
                VALUES (h, cur_key, cur_used)
                ON CONFLICT (handler) DO UPDATE
                    SET concurrency_key = excluded.concurrency_key, used = excluded.used;
            END IF;
            -- out of probes: the rest of the room in claim_v3's order (work-conserving)
            IF probes >= budget THEN
                fill[i] := room - picked;
            END IF;
        END LOOP;
    END IF;

    RETURN QUERY
    WITH wanted AS (
        SELECT s.handler, s.lease_seconds,
               s.free - coalesce(cardinality(array_positions(taken, s.handler)), 0) AS free,
               s.max_attempts,
               s.max_running, s.per_key, s.fair IS TRUE AS fair, s.fill, s.rate, s.rate_per_key,
               CASE WHEN jsonb_typeof((SELECT claim_v4.handler_queues) -> (s.n::integer - 1))
                         = 'array'
                    THEN ARRAY(SELECT jsonb_array_elements_text(
                                   (SELECT claim_v4.handler_queues) -> (s.n::integer - 1)))
               END AS queues
        FROM unnest((SELECT claim_v4.handlers), (SELECT claim_v4.lease_seconds),
                    (SELECT claim_v4.free), (SELECT claim_v4.handler_max_attempts),
                    (SELECT claim_v4.max_running), (SELECT claim_v4.max_running_per_key),
                    (SELECT claim_v4.fair), (SELECT fill), (SELECT claim_v4.rate),
                    (SELECT claim_v4.rate_per_key))
             WITH ORDINALITY AS s(handler, lease_seconds, free, max_attempts, max_running,
                                  per_key, fair, fill, rate, rate_per_key, n)
        WHERE NOT EXISTS (SELECT 1 FROM @schema@.paused p
                           WHERE p.kind = 'handler' AND p.name = s.handler)
    ), open_queues AS (
        SELECT ARRAY(SELECT q FROM unnest((SELECT claim_v4.queues)::text[]) AS q
                      WHERE NOT EXISTS (SELECT 1 FROM @schema@.paused p
                                         WHERE p.kind = 'queue' AND p.name = q)) AS queues
    ), key_used AS (
        SELECT s.handler, k.concurrency_key, k.n
        FROM wanted s CROSS JOIN LATERAL (
            SELECT r.concurrency_key, count(*) AS n FROM @schema@.jobs r
            WHERE r.status = 'running' AND r.handler = s.handler
              AND r.concurrency_key IS NOT NULL AND r.locked_until > now()
            GROUP BY r.concurrency_key) k
        WHERE s.per_key IS NOT NULL
    ), served AS (
        SELECT s.handler, s.lease_seconds, s.max_attempts, s.queues, s.per_key, s.fair,
               s.fill, s.rate, s.rate_per_key,
               CASE WHEN s.rate IS NOT NULL AND EXISTS (
                        SELECT 1 FROM @schema@.rate_buckets b
                         WHERE b.handler = s.handler AND b.concurrency_key = ''
                           AND b.next_at > now()) THEN 0
                    WHEN s.max_running IS NULL THEN
                        CASE WHEN s.rate IS NULL THEN s.free ELSE least(s.free, 1) END
                    ELSE least(s.free, CASE WHEN s.rate IS NULL THEN s.free ELSE 1 END,
                               s.max_running - (
                        SELECT count(*) FROM @schema@.jobs r
                        WHERE r.status = 'running' AND r.handler = s.handler
                          AND r.locked_until > now())::integer) END AS room,
               -- keys that are full, or whose rate token is not due: left out
               CASE WHEN s.per_key IS NOT NULL OR s.rate_per_key IS NOT NULL
                    THEN ARRAY(SELECT k.concurrency_key FROM key_used k
                                WHERE k.handler = s.handler AND k.n >= s.per_key
                               UNION ALL
                               SELECT b.concurrency_key FROM @schema@.rate_buckets b
                                WHERE s.rate_per_key IS NOT NULL
                                  AND b.handler = s.handler AND b.concurrency_key <> ''
                                  AND b.next_at > now()) END
                   AS full_keys
        FROM wanted s
        WHERE NOT EXISTS (SELECT 1 FROM @schema@.workers w
                           WHERE w.id = (SELECT claim_v4.worker) AND w.drain_requested)
    ), due AS (
        SELECT d.id, d.priority, d.run_at, d.concurrency_key, s.handler
        FROM served s CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_at, j.concurrency_key FROM @schema@.jobs j
            WHERE j.status = 'pending' AND j.run_at <= now() AND j.handler = s.handler
              AND j.queue = ANY((SELECT o.queues FROM open_queues o)::text[])
              AND (s.queues IS NULL OR j.queue = ANY(s.queues))
              AND (s.full_keys IS NULL OR j.concurrency_key IS NULL
                   OR j.concurrency_key <> ALL(s.full_keys))
              AND j.id <> ALL((SELECT fair_ids)::bigint[])
            ORDER BY j.priority, j.run_at, j.id
            LIMIT greatest(0, least(s.room, (SELECT jobs_left), coalesce(s.fill, s.room)))
            FOR UPDATE SKIP LOCKED) d
        WHERE s.room > 0
        UNION ALL
        -- the fair turns' picks (locked by their statements above)
        SELECT j.id, j.priority, j.run_at, j.concurrency_key, j.handler
        FROM @schema@.jobs j
        WHERE j.id = ANY((SELECT fair_ids)::bigint[]) AND j.status = 'pending'
    ), expired AS (
        SELECT j.id, j.priority, j.run_at, j.handler, j.concurrency_key,
               (j.attempts >= j.max_attempts OR j.cancel_requested) AS finished
        FROM @schema@.jobs j
        WHERE j.status = 'running' AND j.locked_until < now()
          AND j.queue = ANY((SELECT o.queues FROM open_queues o)::text[])
          AND EXISTS (SELECT 1 FROM served s
                       WHERE s.handler = j.handler AND s.room > 0
                         AND (s.queues IS NULL OR j.queue = ANY(s.queues))
                         AND (s.full_keys IS NULL OR j.concurrency_key IS NULL
                              OR j.concurrency_key <> ALL(s.full_keys)))
        ORDER BY j.locked_until
        LIMIT (SELECT jobs_left)
        FOR UPDATE SKIP LOCKED
    ), buried AS (
        UPDATE @schema@.jobs j
           SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                             ELSE 'dead' END::@schema@.job_status,
               last_error = 'lease of ' || j.locked_by || ' expired during attempt '
                            || j.attempts || ' of ' || j.max_attempts || ': the worker was lost',
               locked_by = NULL, locked_until = NULL, finished_at = now(), updated_at = now(),
               lease_token = j.lease_token + 1
          FROM expired e
         -- (0043) by primary key from `expired`, as the claim's UPDATE below: planned
         -- while the jobs table was empty, a join read every job at every claim
         WHERE j.id = ANY(ARRAY(SELECT x.id FROM expired x WHERE x.finished))
           AND j.id = e.id AND e.finished
        RETURNING j.id
    ), candidates AS (
        SELECT id, priority, run_at, handler, concurrency_key, false AS rescued FROM due
        UNION ALL
        SELECT id, priority, run_at, handler, concurrency_key, true FROM expired
        WHERE NOT finished
    ), within_keys AS (
        -- at most what each key has left (per_key minus its current leases; one start
        -- per key with a rate), the best first
        SELECT c.id, c.priority, c.run_at, c.handler, c.concurrency_key, c.rescued, c.fair
        FROM (
            SELECT c.*, s.per_key, s.rate_per_key, s.fair,
                   row_number() OVER (PARTITION BY c.handler, c.concurrency_key
                                      ORDER BY c.priority, c.run_at, c.id) AS nk
            FROM candidates c JOIN served s USING (handler)) c
        WHERE c.concurrency_key IS NULL
           OR ((c.per_key IS NULL
                OR c.nk <= c.per_key - coalesce((SELECT k.n FROM key_used k
                                                 WHERE k.handler = c.handler
                                                   AND k.concurrency_key = c.concurrency_key), 0))
               AND (c.rate_per_key IS NULL OR c.nk <= 1))
    ), chosen AS (
        SELECT id, handler, concurrency_key, rescued, lease_seconds, max_attempts, rate,
               rate_per_key FROM (
            SELECT c.id, c.handler, c.concurrency_key, c.priority, c.run_at, c.rescued,
                   s.room, s.lease_seconds, s.max_attempts, s.rate, s.rate_per_key,
                   -- a fair handler's turns first, then claim_v3's order
                   row_number() OVER (PARTITION BY c.handler
                                      ORDER BY CASE WHEN c.fair AND c.id = ANY((SELECT fair_ids)::bigint[])
                                                    THEN 0 ELSE 1 END,
                                               c.priority, c.run_at, c.id) AS n
            FROM within_keys c JOIN served s USING (handler)) ranked
        WHERE n <= room
        ORDER BY priority, run_at, id
        LIMIT (SELECT jobs_left)
    ), debited AS (
        -- the starts' tokens, in the claiming statement: they commit with the claim
        INSERT INTO @schema@.rate_buckets AS b (handler, concurrency_key, next_at)
        SELECT c.handler, '', now() + make_interval(secs => count(*) / min(c.rate))
          FROM chosen c WHERE c.rate IS NOT NULL GROUP BY c.handler
        UNION ALL
        SELECT c.handler, c.concurrency_key,
               now() + make_interval(secs => count(*) / min(c.rate_per_key))
          FROM chosen c WHERE c.rate_per_key IS NOT NULL AND c.concurrency_key IS NOT NULL
         GROUP BY c.handler, c.concurrency_key
        ON CONFLICT (handler, concurrency_key) DO UPDATE
            SET next_at = greatest(b.next_at, now()) + (excluded.next_at - now())
    )
    UPDATE @schema@.jobs j
       SET status = 'running',
           locked_by = claim_v4.worker,
           locked_until = now() + make_interval(secs => c.lease_seconds),
           attempts = j.attempts + 1,
           max_attempts = greatest(j.attempts + 1, coalesce(c.max_attempts, j.max_attempts)),
           lease_token = j.lease_token + 1,
           last_error = CASE WHEN j.status = 'running'
                             THEN 'lease of ' || j.locked_by || ' expired during attempt '
                                  || j.attempts || ': the worker was lost'
                             ELSE j.last_error END,
           started_at = now(),
           updated_at = now()
      FROM chosen c
     WHERE j.id = ANY(ARRAY(SELECT id FROM chosen)) AND j.id = c.id
    RETURNING j.id, j.queue, j.handler, j.payload, j.priority, j.attempts, j.max_attempts,
              j.lease_token, j.checkpoint, j.run_at, j.created_at, j.locked_until,
              c.rescued AS rescued;
    GET DIAGNOSTICS got = ROW_COUNT;
    jobs_left := jobs_left - got::integer;
    EXIT WHEN got = 0 OR jobs_left <= 0
              OR (cardinality(keyed) = 0 AND NOT coalesce(true = ANY(claim_v4.fair), false))
              OR pass >= 4;
    taken := ARRAY(SELECT j.handler FROM @schema@.jobs j
                    WHERE j.status = 'running' AND j.handler = ANY(claim_v4.handlers)
                      AND j.locked_by = claim_v4.worker AND j.started_at = now());
    END LOOP;
END;
$$;

COMMENT ON FUNCTION @schema@.claim_v4(text, text[], text[], float8[], integer[], integer,
                                      integer[], jsonb, integer[], integer[], boolean[],
                                      jsonb, float8[], float8[]) IS
    'claim_v3 plus fair share by concurrency key and start-rate limits (schema 33): the '
    'implementation behind claim_jobs_v3. docs/guide/limits.md.';

-- claim_jobs: the stable claim, for the daemon (queries/jobs.sql job_claim) and for workers in
-- any language (README "Jobs"). Named, documented arguments, each checked (a bad one
-- raises 22023 naming it, and claims nothing); then claim_v3's one implementation:
-- queues and handlers paused by `pgworkerd pause` are left out, fleet-wide limits and
-- per-key limits hold (as given by the caller: each claim applies its own caller's
-- limits, see claim_v3), expired leases are rescued, a drained worker claims nothing.
-- Its commit is durable whatever the server's synchronous_commit (see the 0019 header).
--   SELECT * FROM pgworkerd.claim_jobs(
--       worker => 'worker-1', queues => '{default,mail}', handlers => '{send_mail,export}',
--       lease_seconds => '{300,60}', free_slots => '{4,2}', max_jobs => 6,
--       max_running => '{NULL,10}', max_running_per_key => '{NULL,2}');
-- The per-handler arguments are arrays in the order of `handlers`, one element each.
CREATE FUNCTION @schema@.claim_jobs(
    worker text,                -- this worker's name; the finishing functions take it back
    queues text[],              -- the queues to claim from
    handlers text[],            -- the handlers this worker runs, each named once
    lease_seconds float8[],     -- per handler: the lease a claimed job gets (0 < s <= 100 y)
    free_slots integer[],       -- per handler: how many more jobs it may take now (>= 0)
    max_jobs integer,           -- at most this many jobs in all (>= 0)
    handler_max_attempts integer[] DEFAULT NULL,  -- per handler: overrides the job's own
    -- per handler: a JSON array of the queues (among `queues`) it claims from, or null for
    -- all of them; the whole argument NULL: every handler claims from all of them
    handler_queues jsonb DEFAULT NULL,
    max_running integer[] DEFAULT NULL,           -- per handler: fleet-wide, or NULL
    max_running_per_key integer[] DEFAULT NULL    -- per handler: per concurrency key, or NULL
)
RETURNS TABLE (
    id bigint, queue text, handler text, payload jsonb, priority integer, attempts integer,
    max_attempts integer, lease_token bigint, checkpoint jsonb, run_at timestamptz,
    created_at timestamptz, locked_until timestamptz, rescued boolean
)
LANGUAGE plpgsql
SECURITY DEFINER
-- SECURITY DEFINER (since 0022, when the daemon role lost UPDATE on jobs): EXECUTE is
-- revoked from PUBLIC below and granted to pgworkerd_daemon by roles.sql.
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    n integer := coalesce(cardinality(claim_jobs.handlers), 0);
    duplicated boolean := false;
    problem text;
BEGIN
    -- The checks are plain expressions (no subquery, so PL/pgSQL evaluates them without
    -- the executor: they cost the daemon's claims next to nothing), bar this one, which
    -- only a claim for several handlers needs.
    IF n > 1 THEN
        duplicated := (SELECT count(DISTINCT h) FROM unnest(claim_jobs.handlers) h) <> n;
    END IF;
    problem := CASE
        WHEN claim_jobs.worker IS NULL OR claim_jobs.worker = '' THEN
            'worker must name this worker (the finishing functions take the name back), not '
            || coalesce(quote_literal(claim_jobs.worker), 'NULL')
        WHEN claim_jobs.queues IS NULL OR array_ndims(claim_jobs.queues) > 1
             OR array_position(claim_jobs.queues, NULL) IS NOT NULL THEN
            'queues must be an array of queue names without NULL, not '
            || coalesce(left(claim_jobs.queues::text, 200), 'NULL')
        WHEN claim_jobs.handlers IS NULL OR array_ndims(claim_jobs.handlers) > 1
             OR array_position(claim_jobs.handlers, NULL) IS NOT NULL
             OR array_position(claim_jobs.handlers, '') IS NOT NULL OR duplicated THEN
            'handlers must be an array of handler names, each named once, without NULL or '
            || 'empty names, not '
            || coalesce(left(claim_jobs.handlers::text, 200), 'NULL')
        WHEN claim_jobs.lease_seconds IS NULL OR array_ndims(claim_jobs.lease_seconds) > 1
             OR cardinality(claim_jobs.lease_seconds) <> n
             -- NaN is above every number: refused by the second test
             OR (0 < ALL(claim_jobs.lease_seconds)
                 AND 3153600000 >= ALL(claim_jobs.lease_seconds)) IS NOT TRUE THEN
            'lease_seconds must give each handler its lease in seconds (above 0, at most '
            || '100 years), one per handler in the order of handlers, not '
            || coalesce(left(claim_jobs.lease_seconds::text, 200), 'NULL')
        WHEN claim_jobs.free_slots IS NULL OR array_ndims(claim_jobs.free_slots) > 1
             OR cardinality(claim_jobs.free_slots) <> n
             OR (0 <= ALL(claim_jobs.free_slots)) IS NOT TRUE THEN
            'free_slots must give each handler how many more jobs it may take (0 or more), '
            || 'one per handler in the order of handlers, not '
            || coalesce(left(claim_jobs.free_slots::text, 200), 'NULL')
        WHEN claim_jobs.max_jobs IS NULL OR claim_jobs.max_jobs < 0 THEN
            'max_jobs must be 0 or more, not ' || coalesce(claim_jobs.max_jobs::text, 'NULL')
        WHEN claim_jobs.handler_max_attempts IS NOT NULL
             AND (array_ndims(claim_jobs.handler_max_attempts) > 1
                  OR cardinality(claim_jobs.handler_max_attempts) <> n
                  OR (1 > ANY(claim_jobs.handler_max_attempts)) IS TRUE) THEN
            'handler_max_attempts must be NULL, or one per handler in the order of handlers, '
            || 'each NULL (the job''s own) or at least 1, not '
            || left(claim_jobs.handler_max_attempts::text, 200)
        WHEN claim_jobs.handler_queues IS NOT NULL
             AND (jsonb_typeof(claim_jobs.handler_queues) <> 'array'
                  OR jsonb_array_length(claim_jobs.handler_queues) <> n
                  -- strict: lax mode would look into the inner arrays as well
                  OR jsonb_path_exists(claim_jobs.handler_queues,
                                       'strict $[*] ? (@.type() != "null" && @.type() != "array")')
                  OR jsonb_path_exists(claim_jobs.handler_queues,
                                       'strict $[*] ? (@.type() == "array")[*] ? (@.type() != "string")'))
             THEN
            'handler_queues must be NULL, or a JSON array with one element per handler in the '
            || 'order of handlers, each null (all of queues) or an array of queue names, not '
            || left(claim_jobs.handler_queues::text, 200)
        WHEN claim_jobs.max_running IS NOT NULL
             AND (array_ndims(claim_jobs.max_running) > 1
                  OR cardinality(claim_jobs.max_running) <> n
                  OR (1 > ANY(claim_jobs.max_running)) IS TRUE) THEN
            'max_running must be NULL, or one per handler in the order of handlers, each '
            || 'NULL (no limit) or at least 1, not ' || left(claim_jobs.max_running::text, 200)
        WHEN claim_jobs.max_running_per_key IS NOT NULL
             AND (array_ndims(claim_jobs.max_running_per_key) > 1
                  OR cardinality(claim_jobs.max_running_per_key) <> n
                  OR (1 > ANY(claim_jobs.max_running_per_key)) IS TRUE) THEN
            'max_running_per_key must be NULL, or one per handler in the order of handlers, '
            || 'each NULL (no limit) or at least 1, not '
            || left(claim_jobs.max_running_per_key::text, 200)
    END;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgworkerd: claim_jobs: %', problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A durable commit (see the 0019 header: SET LOCAL here, never a SET clause).
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    RETURN QUERY
    SELECT * FROM @schema@.claim_v3(
        claim_jobs.worker, claim_jobs.queues, claim_jobs.handlers, claim_jobs.lease_seconds,
        claim_jobs.free_slots, claim_jobs.max_jobs, claim_jobs.handler_max_attempts,
        claim_jobs.handler_queues, claim_jobs.max_running, claim_jobs.max_running_per_key);
END;
$$;

-- Who still calls each claim (a contract migration drops the old ones once no supported
-- release calls them).
COMMENT ON FUNCTION @schema@.claim_jobs(text, text[], text[], float8[], integer[], integer,
                                        integer[], jsonb, integer[], integer[]) IS
    'The stable claim (schema 19) for the daemon and for workers in any language: pauses, '
    'fleet-wide and per-key limits, rescues, a durable commit. README "Jobs".';

REVOKE EXECUTE ON FUNCTION
    @schema@.claim_jobs(text, text[], text[], float8[], integer[], integer, integer[], jsonb,
                        integer[], integer[])
    FROM PUBLIC;

-- claim_jobs_v2 (0027, issue 24): claim_jobs, plus deadlines and dependencies.
--   * Absurd arrays are refused (22023) before anything: more than 1,000 handlers or
--     queues (a daemon serves a few dozen; architecture review 8.3).
--   * No job starts after its expires_at: jobs past it are ended first, as 'cancelled'
--     with the reason in last_error ("expired: ..."): pending ones, and running ones whose
--     lease ran out (a rescue would start a new attempt). Any claimer ends any expired
--     job (rows another claim holds are skipped, never waited for), at most 1,000 of
--     each per claim, through job_expired_cancel (retention.sql; since 0039); the partial index
--     jobs_pending_expires_idx holds only pending jobs with a deadline, so a queue
--     without deadlines pays one probe of an empty index.
--   * Two more columns per claimed job: timeout_seconds (the job's own, overriding the
--     handler's; NULL: the handler's) and parents: for a job with parents only, a JSON
--     object of each parent's id (as text) and result (null unless it completed), read
--     here so that the handler sees them (job.parents) without a database connection;
--     NULL for every other job, which costs one test more. And has_children: some job
--     waits for this one (as claimed), so the daemon claims again with its completion,
--     in the transaction whose trigger releases those children.
CREATE FUNCTION @schema@.claim_jobs_v2(
    worker text,
    queues text[],
    handlers text[],
    lease_seconds float8[],
    free_slots integer[],
    max_jobs integer,
    handler_max_attempts integer[] DEFAULT NULL,
    handler_queues jsonb DEFAULT NULL,
    max_running integer[] DEFAULT NULL,
    max_running_per_key integer[] DEFAULT NULL
)
RETURNS TABLE (
    id bigint, queue text, handler text, payload jsonb, priority integer, attempts integer,
    max_attempts integer, lease_token bigint, checkpoint jsonb, run_at timestamptz,
    created_at timestamptz, locked_until timestamptz, rescued boolean,
    timeout_seconds float8, parents jsonb, has_children boolean
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- as claim_v3: a backlog's estimated cost would cross jit_above_cost (~60 ms of compiling
-- for a statement of a fraction of a millisecond)
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    claimed record;
    has_parents boolean;
BEGIN
    IF cardinality(claim_jobs_v2.handlers) > 1000 OR cardinality(claim_jobs_v2.queues) > 1000
    THEN
        RAISE EXCEPTION 'pgworkerd: claim_jobs_v2: at most 1000 handlers and 1000 queues, '
                        'not % and %', cardinality(claim_jobs_v2.handlers),
                        cardinality(claim_jobs_v2.queues)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Expired jobs end before the claim can see them (its now() is this one): the
    -- daemons' expiry sweep, the one text of that transition (retention.sql, 0039).
    PERFORM @schema@.job_expired_cancel(1000);
    -- One row at a time: the look-up of each claimed job's row is a statement of its own,
    -- whose snapshot sees the claim (a join in the claim's statement would read rows as
    -- they were before it, and miss a job enqueued meanwhile that the claim took).
    FOR claimed IN
        SELECT * FROM @schema@.claim_jobs(
            claim_jobs_v2.worker, claim_jobs_v2.queues, claim_jobs_v2.handlers,
            claim_jobs_v2.lease_seconds, claim_jobs_v2.free_slots, claim_jobs_v2.max_jobs,
            claim_jobs_v2.handler_max_attempts, claim_jobs_v2.handler_queues,
            claim_jobs_v2.max_running, claim_jobs_v2.max_running_per_key)
    LOOP
        id := claimed.id; queue := claimed.queue; handler := claimed.handler;
        payload := claimed.payload; priority := claimed.priority;
        attempts := claimed.attempts; max_attempts := claimed.max_attempts;
        lease_token := claimed.lease_token; checkpoint := claimed.checkpoint;
        run_at := claimed.run_at; created_at := claimed.created_at;
        locked_until := claimed.locked_until; rescued := claimed.rescued;
        SELECT j.timeout_seconds, j.parents_unfinished IS NOT NULL, j.has_children
          INTO timeout_seconds, has_parents, has_children
          FROM @schema@.jobs j WHERE j.id = claimed.id;
        parents := NULL;
        IF has_parents THEN
            -- {"<parent id>": its result (null unless it completed, or if pruned)}
            SELECT jsonb_object_agg(p.parent_id::text, pj.result) INTO parents
              FROM @schema@.job_parents p
              LEFT JOIN @schema@.jobs pj ON pj.id = p.parent_id
             WHERE p.child_id = claimed.id;
        END IF;
        RETURN NEXT;
    END LOOP;
END;
$$;

COMMENT ON FUNCTION @schema@.claim_jobs_v2(text, text[], text[], float8[], integer[],
                                           integer, integer[], jsonb, integer[], integer[]) IS
    'claim_jobs, ending jobs past their expires_at first, with each job''s own timeout and '
    'its parents'' results (schema 27). Called by daemons of schemas 27 to 30 and by '
    'workers in other languages; new code calls claim_jobs_v3. docs/reference/sql-api.md.';

REVOKE EXECUTE ON FUNCTION
    @schema@.claim_jobs_v2(text, text[], text[], float8[], integer[], integer, integer[],
                           jsonb, integer[], integer[])
    FROM PUBLIC;

-- claim_jobs_v3 (0031, issue 24): claim_jobs_v2 with its per-handler settings as one JSON
-- array, and what a claimed job needs from other rows in its row, read by the claim:
--   * handlers: one JSON object per handler, {"name", "lease_seconds", "free",
--     "max_attempts", "queues", "max_running", "max_running_per_key"} (the arguments of
--     claim_jobs of those names; a key absent or null: none), and since 0033 "fair",
--     "weights", "rate", "rate_per_key" (claim_v4's fair, fair_weights, rate and
--     rate_per_key: true/false, {key: 1..1000}, starts per second; absent or null: none;
--     the claim is claim_v4's, which with none of them is claim_v3's). Each is checked, and a bad
--     one raises 22023 saying which and why and claims nothing: not an array, more than
--     1,000 handlers or queues, an object with a key it does not know (a misspelt limit
--     must not pass for no limit), a name twice, a number of the wrong type, fractional,
--     negative or beyond its bound.
--   * wait_for, wait_ended, signal_payload, signal_sent_at: what ended the job's last
--     wait (WaitFor, 0028): the name it waited for, 'signal' or 'timeout', and the
--     signal's payload and time (NULL unless a signal ended it); all NULL for a job that
--     never waited. The daemon read them after each claim until 0031 (job_wakeups).
--   * batch: for a batch's callback (0030), the batch's counts and the outcomes of its
--     first 100 members by id, {"id", "members", "completed", "dead", "cancelled",
--     "outcomes": [{"id", "status", "result", "error"}, ...], "outcomes_complete"};
--     NULL for any other job. The daemon read it after each claim until 0031
--     (batch_outcomes).
--   * trace_context: the enqueuer's W3C trace context ({"traceparent", "tracestate"},
--     0035), NULL for a job enqueued outside a trace. The daemon read it after each claim
--     while tracing until 0039 (job_traces).
-- Two statements after the claim, whatever it took (claim_jobs_v2 ran one per claimed
-- job): the claim's ids are collected, then one statement reads their rows with their
-- parents, signals and batches. A statement of its own, so that its snapshot sees the
-- claim (a join in the claim's statement would read rows as they were before it, and
-- miss a job enqueued meanwhile that the claim took); the rows are locked by the claim,
-- so nothing changed them in between.
-- A rolling upgrade: older daemons keep calling claim_jobs_v2, which stays (other
-- languages' workers may too). The implementation behind both is claim_v3.
--   SELECT * FROM pgworkerd.claim_jobs_v3('worker-1', '{default,mail}', 6,
--       '[{"name": "send_mail", "lease_seconds": 300, "free": 4},
--         {"name": "export", "lease_seconds": 60, "free": 2, "queues": ["default"],
--          "max_running": 10, "max_running_per_key": 2}]');
CREATE FUNCTION @schema@.claim_jobs_v3(
    worker text,      -- this worker's name; the finishing functions take it back
    queues text[],    -- the queues to claim from (at most 1,000)
    max_jobs integer, -- at most this many jobs in all (>= 0)
    handlers jsonb    -- one object per handler this worker runs (at most 1,000), above
)
RETURNS TABLE (
    id bigint, queue text, handler text, payload jsonb, priority integer, attempts integer,
    max_attempts integer, lease_token bigint, checkpoint jsonb, run_at timestamptz,
    created_at timestamptz, locked_until timestamptz, rescued boolean,
    timeout_seconds float8, parents jsonb, has_children boolean,
    wait_for text, wait_ended text, signal_payload jsonb, signal_sent_at timestamptz,
    batch jsonb, trace_context jsonb
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- as claim_v3: a backlog's estimated cost would cross jit_above_cost
SET jit = off
-- (0042) its last statement reads the claimed rows through an array of ids: left to
-- plan_cache_mode = auto it was planned anew at every call, 0.45 ms of an idle claim's
-- 1.2 ms; the generic plan is the same join by primary key
SET plan_cache_mode = force_generic_plan
-- (0043) each of its reads of jobs (and claim_v3's and claim_v4's) has an index made for
-- it; but a plan made while the table was empty (a daemon's first claims, after a
-- vacuum of an empty queue), and kept as above, read every job at every claim once a
-- backlog came: a claim of 40 jobs took 33 ms instead of 3 (bench/claim_cost.py)
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    -- The keys a handler object may have. A successor's keys join this list in the same
    -- CREATE OR REPLACE that reads them (absent: today's behaviour).
    known_keys CONSTANT text[] := '{name,lease_seconds,free,max_attempts,queues,max_running,'
                                  'max_running_per_key,fair,weights,rate,rate_per_key}';
    int4_max CONSTANT numeric := 2147483647;
    lease_max CONSTANT numeric := 3153600000;  -- seconds: 100 years
    rate_max CONSTANT numeric := 1000000;      -- starts per second
    queues_max CONSTANT integer := 1000;       -- queues per handler
    problem text;
    names text[];
    leases float8[];
    free integer[];
    attempts_over integer[];
    their_queues jsonb;
    running integer[];
    per_key integer[];
    fair boolean[];
    weights jsonb;
    rate float8[];
    rate_per_key float8[];
    claimed_ids bigint[];
    claimed_rescued boolean[];
BEGIN
    problem := CASE
        WHEN claim_jobs_v3.worker IS NULL OR claim_jobs_v3.worker = '' THEN
            'worker must name this worker (the finishing functions take the name back), not '
            || coalesce(quote_literal(claim_jobs_v3.worker), 'NULL')
        WHEN claim_jobs_v3.queues IS NULL OR array_ndims(claim_jobs_v3.queues) > 1
             OR array_position(claim_jobs_v3.queues, NULL) IS NOT NULL THEN
            'queues must be an array of queue names without NULL, not '
            || coalesce(left(claim_jobs_v3.queues::text, 200), 'NULL')
        WHEN cardinality(claim_jobs_v3.queues) > 1000 THEN
            'queues must name at most 1000 queues, not '
            || cardinality(claim_jobs_v3.queues)
        WHEN claim_jobs_v3.max_jobs IS NULL OR claim_jobs_v3.max_jobs < 0 THEN
            'max_jobs must be 0 or more, not ' || coalesce(claim_jobs_v3.max_jobs::text, 'NULL')
        WHEN claim_jobs_v3.handlers IS NULL
             OR jsonb_typeof(claim_jobs_v3.handlers) <> 'array' THEN
            'handlers must be a JSON array of handler objects, not '
            || coalesce(left(claim_jobs_v3.handlers::text, 200), 'NULL')
        WHEN jsonb_array_length(claim_jobs_v3.handlers) > 1000 THEN
            'handlers must hold at most 1000 handlers, not '
            || jsonb_array_length(claim_jobs_v3.handlers)
    END;
    -- (0043) Handler objects as the daemon sends them pass one jsonpath test of every
    -- key, a tenth of a claim's time on an empty queue less than the checks below, which
    -- then run only for a claim that fails it, to find and name the first bad value. The
    -- test is at least as strict as they are, so it only saves time: the elements are
    -- objects (in strict mode: lax mode would look inside a nested array), and each
    -- value's .type() is tested before it is compared (lax mode unwraps an array in a
    -- comparison, never in .type()); `@.key == $known` holds if the key is one of them.
    IF problem IS NULL
       AND (jsonb_path_exists(claim_jobs_v3.handlers, 'strict $[*] ? (@.type() != "object")')
            OR jsonb_array_length(jsonb_path_query_array(claim_jobs_v3.handlers,
                   'lax $[*] ? (!exists(@.keyvalue() ? (!(@.key == $known)))
                       && @.name.type() == "string" && @.name != ""
                       && @.lease_seconds.type() == "number"
                       && @.lease_seconds > 0 && @.lease_seconds <= $lease_max
                       && @.free.type() == "number" && @.free >= 0
                       && @.free <= $int4_max && @.free == @.free.floor()
                       && (!exists(@.max_attempts) || @.max_attempts.type() == "null"
                           || (@.max_attempts.type() == "number" && @.max_attempts >= 1
                               && @.max_attempts <= $int4_max
                               && @.max_attempts == @.max_attempts.floor()))
                       && (!exists(@.queues) || @.queues.type() == "null"
                           || (@.queues.type() == "array" && @.queues.size() <= $queues_max
                               && !exists(@.queues[*].type() ? (@ != "string"))))
                       && (!exists(@.max_running) || @.max_running.type() == "null"
                           || (@.max_running.type() == "number" && @.max_running >= 1
                               && @.max_running <= $int4_max
                               && @.max_running == @.max_running.floor()))
                       && (!exists(@.max_running_per_key)
                           || @.max_running_per_key.type() == "null"
                           || (@.max_running_per_key.type() == "number"
                               && @.max_running_per_key >= 1
                               && @.max_running_per_key <= $int4_max
                               && @.max_running_per_key == @.max_running_per_key.floor()))
                       && (!exists(@.fair) || @.fair.type() == "null"
                           || @.fair.type() == "boolean")
                       && (!exists(@.weights) || @.weights.type() == "null"
                           || @.weights.type() == "object")
                       && (!exists(@.rate) || @.rate.type() == "null"
                           || (@.rate.type() == "number" && @.rate > 0
                               && @.rate <= $rate_max))
                       && (!exists(@.rate_per_key) || @.rate_per_key.type() == "null"
                           || (@.rate_per_key.type() == "number" && @.rate_per_key > 0
                               && @.rate_per_key <= $rate_max)))',
                   jsonb_build_object('known', known_keys, 'int4_max', int4_max,
                                      'lease_max', lease_max, 'rate_max', rate_max,
                                      'queues_max', queues_max)))
               <> jsonb_array_length(claim_jobs_v3.handlers)) THEN
        -- the first bad handler object, if any (CASE: each test only once the ones
        -- before it passed, so no cast ever sees a value of the wrong type)
        SELECT format('handlers[%s] %s: %s', e.n - 1, left(e.h::text, 200), p.problem)
          INTO problem
          FROM jsonb_array_elements(claim_jobs_v3.handlers) WITH ORDINALITY AS e(h, n)
         CROSS JOIN LATERAL (SELECT CASE
            WHEN jsonb_typeof(e.h) <> 'object' THEN 'each handler must be a JSON object'
            WHEN EXISTS (SELECT FROM jsonb_object_keys(e.h) k WHERE k <> ALL (known_keys))
                THEN 'unknown key(s) '
                     || (SELECT string_agg(quote_literal(k), ', ' ORDER BY k)
                           FROM jsonb_object_keys(e.h) k WHERE k <> ALL (known_keys))
                     || ': a handler object takes ' || array_to_string(known_keys, ', ')
            WHEN CASE jsonb_typeof(e.h -> 'name')
                     WHEN 'string' THEN e.h ->> 'name' = ''
                     ELSE true END
                THEN '"name" must be the handler''s name, a non-empty string'
            WHEN CASE jsonb_typeof(e.h -> 'lease_seconds')
                     WHEN 'number' THEN NOT ((e.h -> 'lease_seconds')::numeric > 0
                                             AND (e.h -> 'lease_seconds')::numeric <= lease_max)
                     ELSE true END
                THEN '"lease_seconds" must be the lease a claimed job gets, in seconds '
                     '(a number above 0, at most 100 years)'
            WHEN CASE jsonb_typeof(e.h -> 'free')
                     WHEN 'number' THEN NOT ((e.h -> 'free')::numeric
                                             BETWEEN 0 AND int4_max
                                             AND (e.h -> 'free')::numeric
                                                 = trunc((e.h -> 'free')::numeric))
                     ELSE true END
                THEN '"free" must be how many more jobs it may take now (a whole number, '
                     '0 to 2147483647)'
            WHEN CASE coalesce(jsonb_typeof(e.h -> 'max_attempts'), 'null')
                     WHEN 'null' THEN false
                     WHEN 'number' THEN NOT ((e.h -> 'max_attempts')::numeric
                                             BETWEEN 1 AND int4_max
                                             AND (e.h -> 'max_attempts')::numeric
                                                 = trunc((e.h -> 'max_attempts')::numeric))
                     ELSE true END
                THEN '"max_attempts" must be null (the job''s own) or a whole number, '
                     '1 to 2147483647'
            WHEN CASE coalesce(jsonb_typeof(e.h -> 'queues'), 'null')
                     WHEN 'null' THEN false
                     WHEN 'array' THEN jsonb_array_length(e.h -> 'queues') > queues_max
                                       OR jsonb_path_exists(e.h -> 'queues',
                                                            'strict $[*] ? (@.type() != "string")')
                     ELSE true END
                THEN '"queues" must be null (all of queues) or an array of at most 1000 '
                     'queue names'
            WHEN CASE coalesce(jsonb_typeof(e.h -> 'max_running'), 'null')
                     WHEN 'null' THEN false
                     WHEN 'number' THEN NOT ((e.h -> 'max_running')::numeric
                                             BETWEEN 1 AND int4_max
                                             AND (e.h -> 'max_running')::numeric
                                                 = trunc((e.h -> 'max_running')::numeric))
                     ELSE true END
                THEN '"max_running" must be null (no limit) or a whole number, '
                     '1 to 2147483647'
            WHEN CASE coalesce(jsonb_typeof(e.h -> 'max_running_per_key'), 'null')
                     WHEN 'null' THEN false
                     WHEN 'number' THEN NOT ((e.h -> 'max_running_per_key')::numeric
                                             BETWEEN 1 AND int4_max
                                             AND (e.h -> 'max_running_per_key')::numeric
                                                 = trunc((e.h -> 'max_running_per_key')::numeric))
                     ELSE true END
                THEN '"max_running_per_key" must be null (no limit) or a whole number, '
                     '1 to 2147483647'
            -- fair share and start-rate limits (0033; claim_v4 checks the weights' values)
            WHEN coalesce(jsonb_typeof(e.h -> 'fair'), 'null') NOT IN ('null', 'boolean')
                THEN '"fair" must be null or true or false'
            WHEN coalesce(jsonb_typeof(e.h -> 'weights'), 'null') NOT IN ('null', 'object')
                THEN '"weights" must be null or an object of concurrency keys and jobs per '
                     'turn (whole numbers, 1 to 1000)'
            WHEN CASE coalesce(jsonb_typeof(e.h -> 'rate'), 'null')
                     WHEN 'null' THEN false
                     WHEN 'number' THEN NOT ((e.h -> 'rate')::numeric > 0
                                             AND (e.h -> 'rate')::numeric <= rate_max)
                     ELSE true END
                THEN '"rate" must be null (no limit) or starts per second, above 0 and at '
                     'most 1000000'
            WHEN CASE coalesce(jsonb_typeof(e.h -> 'rate_per_key'), 'null')
                     WHEN 'null' THEN false
                     WHEN 'number' THEN NOT ((e.h -> 'rate_per_key')::numeric > 0
                                             AND (e.h -> 'rate_per_key')::numeric <= rate_max)
                     ELSE true END
                THEN '"rate_per_key" must be null (no limit) or starts per second, above 0 '
                     'and at most 1000000'
            END AS problem) p
         WHERE p.problem IS NOT NULL
         ORDER BY e.n
         LIMIT 1;
    END IF;
    IF problem IS NULL THEN
        -- (a key given as JSON null is as one left out, as the checks above say: a cast
        -- of JSON null fails, hence nullif; 0041)
        SELECT array_agg(e.h ->> 'name' ORDER BY e.n),
               array_agg((e.h -> 'lease_seconds')::float8 ORDER BY e.n),
               array_agg((e.h -> 'free')::integer ORDER BY e.n),
               array_agg(nullif(e.h -> 'max_attempts', 'null')::integer ORDER BY e.n),
               jsonb_agg(coalesce(e.h -> 'queues', 'null') ORDER BY e.n),
               array_agg(nullif(e.h -> 'max_running', 'null')::integer ORDER BY e.n),
               array_agg(nullif(e.h -> 'max_running_per_key', 'null')::integer ORDER BY e.n),
               -- NULL when no handler has one: claim_v3's cost for a claim without them
               CASE WHEN bool_or(nullif(e.h -> 'fair', 'null')::boolean) THEN
                   array_agg(nullif(e.h -> 'fair', 'null')::boolean ORDER BY e.n) END,
               CASE WHEN bool_or(nullif(e.h -> 'fair', 'null')::boolean) THEN
                   jsonb_agg(coalesce(e.h -> 'weights', 'null') ORDER BY e.n) END,
               CASE WHEN bool_or(jsonb_typeof(e.h -> 'rate') = 'number') THEN
                   array_agg(nullif(e.h -> 'rate', 'null')::float8 ORDER BY e.n) END,
               CASE WHEN bool_or(jsonb_typeof(e.h -> 'rate_per_key') = 'number') THEN
                   array_agg(nullif(e.h -> 'rate_per_key', 'null')::float8 ORDER BY e.n) END
          INTO names, leases, free, attempts_over, their_queues, running, per_key,
               fair, weights, rate, rate_per_key
          FROM jsonb_array_elements(claim_jobs_v3.handlers) WITH ORDINALITY AS e(h, n);
        IF cardinality(names) <> (SELECT count(DISTINCT h) FROM unnest(names) h) THEN
            problem := 'handlers must name each handler once, not '
                       || left(array_to_string(names, ', '), 200);
        END IF;
    END IF;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgworkerd: claim_jobs_v3: %', problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF names IS NULL THEN
        RETURN;  -- no handler: nothing to claim for
    END IF;
    -- A durable commit (see the 0019 header: SET LOCAL here, never a SET clause).
    PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    -- Expired jobs end before the claim can see them, as claim_jobs_v2 ends them. (0043)
    -- The call only when some job has expired (the first row of each of
    -- job_expired_cancel's two statements): most claims find none, and the call with its
    -- two UPDATEs was a sixth of a claim's time on an empty queue. Each probe keeps its
    -- statement's ORDER BY (not EXISTS, which drops it), so that its plan reads the index
    -- of that order whatever the statistics: planned while the jobs table was empty (a
    -- daemon's first claims), an EXISTS read every pending job through another index.
    IF (SELECT e.expires_at FROM @schema@.jobs e
         WHERE e.status = 'pending' AND e.expires_at <= now()
         ORDER BY e.expires_at LIMIT 1) IS NOT NULL
       OR (SELECT e.locked_until FROM @schema@.jobs e
            WHERE e.status = 'running' AND e.locked_until < now()
              AND e.expires_at <= now()
            ORDER BY e.locked_until LIMIT 1) IS NOT NULL THEN
        PERFORM @schema@.job_expired_cancel(1000);
    END IF;
    -- (0043) claim_v3 when no handler is fair or rate-limited: claim_v4 then behaves as
    -- claim_v3 does (0033), at a quarter more of its cost (its fair and rate passes set
    -- up for nothing).
    IF fair IS NULL AND weights IS NULL AND rate IS NULL AND rate_per_key IS NULL THEN
        SELECT array_agg(c.id), array_agg(c.rescued) INTO claimed_ids, claimed_rescued
          FROM @schema@.claim_v3(claim_jobs_v3.worker, claim_jobs_v3.queues, names, leases,
                                 free, claim_jobs_v3.max_jobs, attempts_over, their_queues,
                                 running, per_key) AS c;
    ELSE
        SELECT array_agg(c.id), array_agg(c.rescued) INTO claimed_ids, claimed_rescued
          FROM @schema@.claim_v4(claim_jobs_v3.worker, claim_jobs_v3.queues, names, leases,
                                 free, claim_jobs_v3.max_jobs, attempts_over, their_queues,
                                 running, per_key, fair, weights, rate, rate_per_key) AS c;
    END IF;
    IF claimed_ids IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT j.id, j.queue, j.handler, j.payload, j.priority, j.attempts, j.max_attempts,
           j.lease_token, j.checkpoint, j.run_at, j.created_at, j.locked_until, c.rescued,
           j.timeout_seconds,
           -- {"<parent id>": its result (null unless it completed, or if pruned)}
           CASE WHEN j.parents_unfinished IS NOT NULL THEN (
               SELECT jsonb_object_agg(p.parent_id::text, pj.result)
                 FROM @schema@.job_parents p
                 LEFT JOIN @schema@.jobs pj ON pj.id = p.parent_id
                WHERE p.child_id = j.id) END,
           j.has_children,
           j.wait_for, j.wait_ended, s.payload, s.sent_at,
           CASE WHEN b.id IS NOT NULL THEN jsonb_build_object(
               'id', b.id, 'members', b.members, 'completed', b.completed, 'dead', b.dead,
               'cancelled', b.cancelled,
               'outcomes', coalesce((
                   SELECT jsonb_agg(jsonb_build_object('id', m.id, 'status', m.status,
                                                       'result', m.result,
                                                       'error', m.last_error) ORDER BY m.id)
                     FROM (SELECT m.id, m.status, m.result, m.last_error
                             FROM @schema@.jobs m
                            WHERE m.batch_id = b.id
                            ORDER BY m.id
                            LIMIT 100) m), '[]'::jsonb),
               'outcomes_complete', b.members <= 100) END,
           j.trace_context
      FROM unnest(claimed_ids, claimed_rescued) AS c(id, rescued)
      JOIN @schema@.jobs j ON j.id = c.id
      LEFT JOIN @schema@.signals s ON s.job_id = j.id AND s.name = j.wait_for
                                  AND j.wait_ended = 'signal'
      LEFT JOIN @schema@.batches b ON b.callback_id = j.id
     ORDER BY j.priority, j.run_at, j.id;
END;
$$;

COMMENT ON FUNCTION @schema@.claim_jobs_v3(text, text[], integer, jsonb) IS
    'claim_jobs_v2 with its per-handler settings as JSON objects, returning what woke each '
    'job and a batch callback''s batch (schema 31): what the daemon calls. '
    'docs/reference/sql-api.md.';

REVOKE EXECUTE ON FUNCTION @schema@.claim_jobs_v3(text, text[], integer, jsonb) FROM PUBLIC;

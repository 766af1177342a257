-- Fair share and start-rate limits (issue 25 items 1 and 2; docs/guide/limits.md): the
-- tables rate_buckets and fair_cursors, the index jobs_pending_fair_idx, and claim_v4
-- (claim_v3 plus fair turns by concurrency key and start-rate limits), behind claim_jobs_v3
-- (0031), whose handler objects take the keys "fair", "weights", "rate", "rate_per_key".
-- compatible-with-code-of-schema: 5
--
-- An expand migration: two new tables, one index, one new function, and claim_jobs_v3
-- replaced with the same signature: it accepts four more keys and, without them, claims
-- as before (claim_v4 without fairness or rates is claim_v3). Older code keeps claiming
-- through claim_v3 (claim_jobs, claim_jobs_v2), which neither reads nor writes them. The declaration is objects/fair_share.sql (and jobs.sql, claim.sql); this is the
-- same text.

-- Fair share and start-rate limits (0033, issue 25 items 1 and 2; docs/guide/limits.md):
-- the state claim_v4 keeps between claims. Only claim_v4 writes these rows, under the
-- advisory lock of their handler (see claim_v3's header), so they never race.

-- Start-rate limits: one row per rate-limited handler (concurrency_key '', which no job's
-- key can be: keys are 1 to 128 characters) and per key of a handler with rate_per_key.
-- A token bucket of one token, kept as the time its next token is due: a claim may start
-- one job of the handler (or key) when next_at <= now(), and sets next_at to now() plus
-- 1/rate. So starts are at least 1/rate apart, and any window of the rate's unit holds at
-- most the rate's count ("20/m": at most 20 starts in any 60 s). A row whose next_at is
-- past means the same as no row: the claim deletes such rows as it goes, so the table
-- holds about the keys started within the last 1/rate_per_key.
CREATE TABLE @schema@.rate_buckets (
    handler         text NOT NULL,
    concurrency_key text NOT NULL,
    next_at         timestamptz NOT NULL,
    PRIMARY KEY (handler, concurrency_key)
);

-- The keys of a handler whose next token is not yet due (claim_v4 leaves their jobs
-- out), and the earliest next token (when the daemons should claim again).
CREATE INDEX rate_buckets_next_at_idx ON @schema@.rate_buckets (handler, next_at);

-- Fair share: per fair handler, the key the round robin served last (concurrency_key ''
-- for jobs without a key, which take their turn as one key) and how many jobs of its turn
-- (its weight) it has had. The next claim continues the turn, then moves on to the next
-- key with pending jobs (in the order of jobs_pending_fair_idx), wrapping around after
-- the last.
CREATE TABLE @schema@.fair_cursors (
    handler         text PRIMARY KEY,
    concurrency_key text NOT NULL,
    used            integer NOT NULL
);

-- Fair share (0033): claim_v4's round robin steps from one key of a fair handler to the
-- next with pending jobs at a priority (one probe per key: its cost is the keys it
-- visits, never the number of keys) and takes each key's oldest due jobs. Jobs without
-- a key are the key '' (no real key is empty): one more key taking its turn.
CREATE INDEX jobs_pending_fair_idx
    ON @schema@.jobs (handler, priority, (coalesce(concurrency_key, '')), run_at, id)
    WHERE status = 'pending';

-- claim_v4 (0033, issue 25 items 1 and 2): claim_v3 plus fair share and start-rate
-- limits, per handler (each argument NULL, or one element per handler in the order of
-- `handlers`; all NULL: claim_v3's behaviour exactly). claim_jobs_v3 calls it.
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
         WHERE j.id = e.id AND e.finished
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

-- claim_jobs_v3 takes fair, weights, rate and rate_per_key, and claims with claim_v4.
CREATE OR REPLACE FUNCTION @schema@.claim_jobs_v3(
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
    batch jsonb
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- as claim_v3: a backlog's estimated cost would cross jit_above_cost
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    -- The keys a handler object may have. A successor's keys join this list in the same
    -- CREATE OR REPLACE that reads them (absent: today's behaviour).
    known_keys CONSTANT text[] := '{name,lease_seconds,free,max_attempts,queues,max_running,'
                                  'max_running_per_key,fair,weights,rate,rate_per_key}';
    int4_max CONSTANT numeric := 2147483647;
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
    IF problem IS NULL THEN
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
                                             AND (e.h -> 'lease_seconds')::numeric <= 3153600000)
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
                     WHEN 'array' THEN jsonb_array_length(e.h -> 'queues') > 1000
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
                                             AND (e.h -> 'rate')::numeric <= 1000000)
                     ELSE true END
                THEN '"rate" must be null (no limit) or starts per second, above 0 and at '
                     'most 1000000'
            WHEN CASE coalesce(jsonb_typeof(e.h -> 'rate_per_key'), 'null')
                     WHEN 'null' THEN false
                     WHEN 'number' THEN NOT ((e.h -> 'rate_per_key')::numeric > 0
                                             AND (e.h -> 'rate_per_key')::numeric <= 1000000)
                     ELSE true END
                THEN '"rate_per_key" must be null (no limit) or starts per second, above 0 '
                     'and at most 1000000'
            END AS problem) p
         WHERE p.problem IS NOT NULL
         ORDER BY e.n
         LIMIT 1;
    END IF;
    IF problem IS NULL THEN
        SELECT array_agg(e.h ->> 'name' ORDER BY e.n),
               array_agg((e.h -> 'lease_seconds')::float8 ORDER BY e.n),
               array_agg((e.h -> 'free')::integer ORDER BY e.n),
               array_agg((e.h -> 'max_attempts')::integer ORDER BY e.n),
               jsonb_agg(coalesce(e.h -> 'queues', 'null') ORDER BY e.n),
               array_agg((e.h -> 'max_running')::integer ORDER BY e.n),
               array_agg((e.h -> 'max_running_per_key')::integer ORDER BY e.n),
               -- NULL when no handler has one: claim_v3's cost for a claim without them
               CASE WHEN bool_or((e.h -> 'fair')::boolean) THEN
                   array_agg((e.h -> 'fair')::boolean ORDER BY e.n) END,
               CASE WHEN bool_or((e.h -> 'fair')::boolean) THEN
                   jsonb_agg(coalesce(e.h -> 'weights', 'null') ORDER BY e.n) END,
               CASE WHEN bool_or(jsonb_typeof(e.h -> 'rate') = 'number') THEN
                   array_agg((e.h -> 'rate')::float8 ORDER BY e.n) END,
               CASE WHEN bool_or(jsonb_typeof(e.h -> 'rate_per_key') = 'number') THEN
                   array_agg((e.h -> 'rate_per_key')::float8 ORDER BY e.n) END
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
    -- Expired jobs end before the claim can see them (claim_jobs_v2's two statements).
    UPDATE @schema@.jobs j
       SET status = 'cancelled', finished_at = now(), updated_at = now(),
           last_error = 'expired: not started by its expires_at ' || j.expires_at
      FROM (SELECT e.id FROM @schema@.jobs e
             WHERE e.status = 'pending' AND e.expires_at <= now()
             ORDER BY e.expires_at
             LIMIT 1000
               FOR UPDATE SKIP LOCKED) AS expired
     WHERE j.id = expired.id;
    UPDATE @schema@.jobs j
       SET status = 'cancelled', finished_at = now(), updated_at = now(),
           locked_by = NULL, locked_until = NULL,
           last_error = 'expired: its lease ran out after its expires_at ' || j.expires_at
                        || '; not started again'
      FROM (SELECT e.id FROM @schema@.jobs e
             WHERE e.status = 'running' AND e.locked_until < now()
               AND e.expires_at <= now()
               FOR UPDATE SKIP LOCKED) AS expired
     WHERE j.id = expired.id;
    SELECT array_agg(c.id), array_agg(c.rescued) INTO claimed_ids, claimed_rescued
      FROM @schema@.claim_v4(claim_jobs_v3.worker, claim_jobs_v3.queues, names, leases, free,
                             claim_jobs_v3.max_jobs, attempts_over, their_queues, running,
                             per_key, fair, weights, rate, rate_per_key) AS c;
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
               'outcomes_complete', b.members <= 100) END
      FROM unnest(claimed_ids, claimed_rescued) AS c(id, rescued)
      JOIN @schema@.jobs j ON j.id = c.id
      LEFT JOIN @schema@.signals s ON s.job_id = j.id AND s.name = j.wait_for
                                  AND j.wait_ended = 'signal'
      LEFT JOIN @schema@.batches b ON b.callback_id = j.id
     ORDER BY j.priority, j.run_at, j.id;
END;
$$;

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

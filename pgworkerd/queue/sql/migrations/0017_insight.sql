-- What `status`, `explain` and the dashboard read (issue 13): indexes for the jobs page
-- and the throughput chart, and each daemon's handler settings in the registry.
-- compatible-with-code-of-schema: 5
--
-- An expand migration (README "Upgrading"): a column with a constant default (no table
-- rewrite) and indexes; no function changes, so older daemons run on (they leave
-- handler_settings empty, and `explain` never blames their limits).
--
-- Cost on a live table: migrations run in one transaction, so each CREATE INDEX holds a
-- SHARE lock on jobs while it builds: enqueues, claims and finishes wait until it ends
-- (reads do not). Measured on 10 M finished jobs (README "Reading the queue"): 10 to
-- 60 s per index on 2 loaded CPUs. On a large table build them beforehand without
-- blocking writes,
--     CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_status_id_idx ON pgworkerd.jobs (status, id);
-- (and so on for the others, same names and columns), then migrate: IF NOT EXISTS
-- makes the migration skip what is there.

-- The handler settings a daemon claims with (handler name -> {"queues", "slots",
-- "max_running", "max_running_per_key"}): written at register and heartbeat, read by
-- `explain` to tell whether a fleet-wide or per-key limit holds a job back.
ALTER TABLE @schema@.workers ADD COLUMN handler_settings jsonb NOT NULL DEFAULT '{}';

-- The jobs page (views.jobs_page): newest first, filtered by status, queue or handler,
-- keyset-paginated by id. Full indexes, not partial: the page lists finished jobs too.
-- The page reads one status at a time (a branch per status), so a queue or handler
-- filter finds each status's newest in id order through (queue, status, id) or
-- (handler, status, id), however rare the combination (a (queue, id) index would read
-- every dead job to find that a queue has none).
-- Each costs one index entry per row version (claim, renewals and finish write new row
-- versions; bottom-up deletion keeps the churn in check), measured in bench/.
CREATE INDEX IF NOT EXISTS jobs_status_id_idx ON @schema@.jobs (status, id);
CREATE INDEX IF NOT EXISTS jobs_queue_status_id_idx ON @schema@.jobs (queue, status, id);
CREATE INDEX IF NOT EXISTS jobs_handler_status_id_idx ON @schema@.jobs (handler, status, id);

-- Throughput and failures over the last hour (views.throughput): attempts by end time.
-- Append-only (one row per ended attempt), so it costs one entry per attempt.
CREATE INDEX IF NOT EXISTS attempts_finished_at_idx ON @schema@.attempts (finished_at);

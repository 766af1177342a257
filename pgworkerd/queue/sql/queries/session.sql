-- Statements about the session itself: what it listens to, its transaction's settings,
-- and what its role may change.
--
-- Each statement under a "-- name:" header with a one-line description; queue/queries.py
-- loads every file of this folder into one registry (a name is defined once, in the file
-- of its entity: docs/development/sql.md). @schema@ is replaced by the quoted schema
-- name, @schema_literal@ by it as a string literal and @notify_channel@ (and the other
-- @..._channel@) by the quoted name of a channel; parameters are psycopg's %(name)s
-- placeholders (so a literal percent sign is written %%).

-- name: session_listen
-- Receive the notifications enqueue sends (a hint that due jobs may be waiting).
LISTEN @notify_channel@;

-- name: session_wake_listen
-- Receive the notifications of schema 13's wake trigger and the fleet's own (peers coming
-- and going, drain requests, forwarded wake-ups): JSON payloads, see daemon/peers.py.
LISTEN @wake_channel@;

-- name: session_wake_listen_own
-- Receive the wake-ups aimed at this daemon (workers_wake, schema 40) on its own channel,
-- whose name this returns.
SELECT @schema@.worker_wake_listen(%(worker)s::text);

-- name: wake_forward
-- Hand a wake-up aimed at this daemon on to the daemons ranked after its group (schema
-- 40): their own channels, or the fleet's where one has none.
SELECT @schema@.workers_wake(%(queue)s::text, %(handler)s::text, %(job_id)s::bigint,
                            %(n)s::bigint, %(skip)s::integer, %(hops)s::integer);

-- name: wake_send
-- Send a notification on the wake channel (a daemon forwarding a wake-up it cannot take).
SELECT 1 FROM (SELECT pg_notify(@schema_literal@ || '.wake', %(payload)s::text)) AS sent;

-- name: session_read_side_local
-- For the rest of the current transaction: no JIT compilation and no parallel workers.
-- The read side's plans are index scans that stop early, whose cost estimates (the
-- whole range they might read) pass jit_above_cost and the parallel thresholds:
-- compiling a jobs page took seconds on 10 M rows, and workers were launched even for
-- the branches of statuses not asked (a gating filter that is false).
SELECT set_config('jit', 'off', true), set_config('max_parallel_workers_per_gather', '0', true);

-- name: session_plans_discard
-- Make this session's plans again at their next use, the claim's among them: plans made
-- while the jobs table was empty read a backlog badly (the daemon, at its first claim
-- that fills every slot: docs/benchmarks/2026-11-27-claim-cost.md).
DISCARD PLANS;

-- name: session_statement_timeout_set_local
-- Bound the statements of the current transaction only (PgBouncer may not forward the
-- connection's own statement_timeout startup option).
SELECT set_config('statement_timeout', %(timeout)s, true);

-- name: session_lock_timeout_set_local
-- Bound the lock waits of the current transaction only (the daemon's maintenance: a LOCK TABLE
-- or a migration must not stall its loop behind them).
SELECT set_config('lock_timeout', %(timeout)s, true);

-- name: session_finished_listening
-- Whether this session listens on the channel of finished jobs already (pgworkerd.wait
-- then neither LISTENs nor UNLISTENs: it leaves the caller's session as it found it).
SELECT %(channel)s::text = ANY (ARRAY(SELECT pg_listening_channels())) AS listening;

-- name: session_finished_listen
-- Receive the notification of every job reaching a final status (payload: its id);
-- @finished_channel@ is the quoted name of that channel (queries.finished_channel).
LISTEN @finished_channel@;

-- name: session_finished_unlisten
-- Stop receiving them again.
UNLISTEN @finished_channel@;

-- name: role_writes
-- What the session's role could change through the schema (a read-only dashboard's
-- role must be able to change nothing: `[web] read_only` refuses one that can, N9): the
-- names of the rights it holds, empty for pgworkerd_reader. Any write on a table, any
-- column UPDATE, and EXECUTE on a VOLATILE SECURITY DEFINER function (the others run
-- with the caller's rights, or change nothing: job_get_v1 is STABLE).
SELECT ARRAY(
    SELECT c.relname || ': ' || p.privilege
      FROM pg_catalog.pg_class c
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     CROSS JOIN unnest(ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE']) AS p(privilege)
     WHERE n.nspname = @schema_literal@ AND c.relkind IN ('r', 'p')
       AND (pg_catalog.has_table_privilege(c.oid, p.privilege)
            OR (p.privilege IN ('INSERT', 'UPDATE')
                AND pg_catalog.has_any_column_privilege(c.oid, p.privilege)))
    UNION ALL
    SELECT f.oid::pg_catalog.regprocedure::text || ': EXECUTE'
      FROM pg_catalog.pg_proc f
      JOIN pg_catalog.pg_namespace n ON n.oid = f.pronamespace
     WHERE n.nspname = @schema_literal@ AND f.provolatile = 'v' AND f.prokind = 'f'
       AND f.prosecdef
       AND f.prorettype <> 'pg_catalog.trigger'::pg_catalog.regtype
       AND pg_catalog.has_function_privilege(f.oid, 'EXECUTE')
     ORDER BY 1) AS rights;

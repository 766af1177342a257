-- Least-privilege roles for pgworkerd. Run after `pgworkerd migrate`, as a role with
-- CREATEROLE (CREATE ROLE needs it; a superuser will do), which must also be able to grant
-- on the schema's objects: the schema owner, or a superuser. Each process then connects
-- as its role (README "Install and run"):
--   pgworkerd_daemon:   what `pgworkerd run` needs: claim, renew and finish the jobs
--                       it holds (fenced functions only, no UPDATE on jobs, no lease
--                       token read), write the logs and history of its attempts and its
--                       own registry row, fire the schedules an operator declared at
--                       their ticks, prune above the operator's floor.
--   pgworkerd_enqueuer: enqueue (the SQL functions), and read and wait for the jobs its
--                       own login enqueued (job_get_v1: `pgworkerd.get`/`wait`); it
--                       cannot read or change any other job, nor anything else.
--   pgworkerd_operator: a person at the CLI or the dashboard: read everything
--                       pgworkerd_reader reads, enqueue, cancel, retry, release held
--                       jobs, pause/resume, drain/resume, prune, declare schedules, set
--                       the retention floor, set what enqueuers may ask
--                       (enqueue_bounds) and a handler's default dedupe policy
--                       (handler_default_set).
--   pgworkerd_reader:   read-only, for dashboards (`pgworkerd web --read-only`) and
--                       `jobs`, `show`, `logs`, `explain`, `status`, `schedules`: reads the
--                       jobs, their attempts and logs, the registry, pauses, schedules,
--                       enqueue bounds and handler defaults, and changes nothing.
-- The enqueue functions are SECURITY DEFINER, so enqueuers need no rights on the table.
--
-- Passwords: this file sets none. It creates each role as a LOGIN role without a
-- password, so no password logs in until you give one (there is no placeholder to
-- forget), and leaves a role that exists as it is (its password, its LOGIN): run it again
-- after every upgrade, new releases add grants. Give each role the password of the process
-- that connects as it, as the admin, in psql (it asks twice and sends only the SCRAM
-- verifier: no password in argv, the server's log or psql's history):
--     \password pgworkerd_daemon
-- or let them authenticate otherwise (pg_hba.conf: cert, peer). People and applications
-- may rather log in as their own roles, members of these:
--     CREATE ROLE alice LOGIN IN ROLE pgworkerd_operator;      -- then \password alice
--     CREATE ROLE billing LOGIN IN ROLE pgworkerd_enqueuer;    -- then \password billing
-- An enqueuer reads the jobs of its own login only (jobs.enqueued_by = session_user):
-- applications that must not read each other's jobs need a login each. Role settings are
-- not inherited: copy the ALTER ROLE ... SET lines at the end for such a login.
-- Versions of this file before schema 18 created pgworkerd_daemon and
-- pgworkerd_enqueuer with the password 'change-me': run by a superuser, this file stops
-- at once while one of them still has it (below); set theirs (\password, as above).
--
-- Another schema (`--schema`): replace the schema name in every object's name, e.g.
--     pgworkerd files roles.sql | sed 's/pgworkerd\./myschema./g; s/SCHEMA pgworkerd /SCHEMA myschema /' | psql ...
--
-- Dedupe keys are scoped per handler: a key names one live job of its handler, so an
-- enqueuer cannot block another application's job by squatting its key under another
-- handler. Every enqueuer can still use (and so learn about) keys of any handler it names
-- (enqueue returns the id of the job holding the key, which it may not read if another
-- login enqueued it), and any priority, unless an operator bounds it: a row of
-- pgworkerd.enqueue_bounds gives a login (or every member of a role) a priority range
-- and the prefixes its dedupe and concurrency keys must start with (README "Trust
-- boundaries"). Applications that must not see each other at all need their own schema
-- (`--schema`).

-- Refuse to go on while a role that an earlier version of this file created still has its
-- placeholder password 'change-me': such a login works for anyone who has read this file.
-- The server stores a password as an md5 or a SCRAM-SHA-256 verifier; both are checked by
-- computing what 'change-me' would give (a SCRAM check takes ~0.1 s). Only a superuser
-- may read the verifiers: another role is told that the check did not run.
-- HMAC-SHA-256 (RFC 2104) for SCRAM's key derivation; in pg_temp, gone with the session.
CREATE OR REPLACE FUNCTION pg_temp.pgworkerd_hmac(key bytea, message bytea) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    inner_pad bytea := pg_catalog.decode(pg_catalog.repeat('36', 64), 'hex');
    outer_pad bytea := pg_catalog.decode(pg_catalog.repeat('5c', 64), 'hex');
BEGIN
    FOR n IN 0 .. pg_catalog.length(key) - 1 LOOP  -- keys here are at most 64 bytes
        inner_pad := pg_catalog.set_byte(inner_pad, n, pg_catalog.get_byte(key, n) # 54);
        outer_pad := pg_catalog.set_byte(outer_pad, n, pg_catalog.get_byte(key, n) # 92);
    END LOOP;
    RETURN pg_catalog.sha256(outer_pad || pg_catalog.sha256(inner_pad || message));
END
$$;

DO $$
DECLARE
    placeholder constant bytea := pg_catalog.convert_to('change-me', 'UTF8');
    account record;
    scram text[];
    block bytea;
    salted bit(256);
    salted_hex text := '';
BEGIN
    IF NOT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        RAISE NOTICE 'pgworkerd: only a superuser can tell whether a role still has the '
            'placeholder password of earlier versions of roles.sql (''change-me''): not checked';
        RETURN;
    END IF;
    FOR account IN
        SELECT rolname, rolpassword FROM pg_catalog.pg_authid
         WHERE rolname IN ('pgworkerd_daemon', 'pgworkerd_enqueuer', 'pgworkerd_operator',
                           'pgworkerd_reader')
           AND rolcanlogin AND rolpassword IS NOT NULL
    LOOP
        -- SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey> (RFC 5803)
        scram := pg_catalog.regexp_match(account.rolpassword,
                                         '^SCRAM-SHA-256[$]([0-9]+):([^$]+)[$]([^:]+):');
        IF scram IS NOT NULL THEN
            -- SaltedPassword = PBKDF2-HMAC-SHA-256(password, salt, iterations), one block
            block := pg_temp.pgworkerd_hmac(
                placeholder, pg_catalog.decode(scram[2], 'base64') || '\x00000001'::bytea);
            salted := ('x' || pg_catalog.encode(block, 'hex'))::bit(256);
            FOR i IN 2 .. scram[1]::integer LOOP
                block := pg_temp.pgworkerd_hmac(placeholder, block);
                salted := salted # ('x' || pg_catalog.encode(block, 'hex'))::bit(256);
            END LOOP;
            salted_hex := '';
            FOR i IN 0 .. 3 LOOP
                salted_hex := salted_hex || pg_catalog.lpad(pg_catalog.to_hex(
                    pg_catalog.substring(salted, i * 64 + 1, 64)::bigint), 16, '0');
            END LOOP;
            -- StoredKey = SHA-256(HMAC(SaltedPassword, "Client Key"))
            CONTINUE WHEN pg_catalog.sha256(pg_temp.pgworkerd_hmac(
                              pg_catalog.decode(salted_hex, 'hex'),
                              pg_catalog.convert_to('Client Key', 'UTF8')))
                          <> pg_catalog.decode(scram[3], 'base64');
        ELSIF account.rolpassword
              <> 'md5' || pg_catalog.md5('change-me' || account.rolname) THEN
            CONTINUE;
        END IF;
        RAISE EXCEPTION 'pgworkerd: role % still has the placeholder password ''change-me'' '
                        'of an earlier roles.sql', account.rolname
            USING ERRCODE = 'invalid_password',
                  HINT = pg_catalog.format('Set a real one first, in psql: \password %s '
                                           '(then run this file again).', account.rolname);
    END LOOP;
END
$$;

-- Create the roles that are missing (CREATE ROLE has no IF NOT EXISTS); never a password.
DO $$
DECLARE
    role_name text;
BEGIN
    FOREACH role_name IN ARRAY ARRAY['pgworkerd_daemon', 'pgworkerd_enqueuer',
                                     'pgworkerd_operator', 'pgworkerd_reader'] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = role_name) THEN
            EXECUTE pg_catalog.format('CREATE ROLE %I LOGIN', role_name);
        END IF;
    END LOOP;
END
$$;

-- pgworkerd_daemon: what `pgworkerd run` needs. (It may also drain, resume and pause, as
-- the CLI on a worker host did before the operator role; people use pgworkerd_operator.)
GRANT USAGE ON SCHEMA pgworkerd TO pgworkerd_daemon;

GRANT SELECT ON pgworkerd.schema_version TO pgworkerd_daemon;
-- The daemon reads jobs, and changes them only through the fenced SECURITY DEFINER
-- functions of schema 22 (each checks the job's worker, lease token and status): no
-- UPDATE on any column of jobs, so a compromised worker host cannot put a finished job
-- back, rewrite a payload, a checkpoint or a result outside an attempt it holds, nor
-- create jobs. Since schema 24 it reads no lease token either (every column of jobs and
-- job_logs but lease_token; tokens are drawn at random), so it cannot end or renew
-- another host's running attempt; it fires a declared schedule only at the schedule's
-- own ticks, and prunes finished jobs older than the operator's floor. Earlier versions
-- of this file granted more: taken back here, so running it again after an upgrade
-- leaves only this (see migrations 0022 and 0024 for the upgrade order).
REVOKE UPDATE ON pgworkerd.jobs FROM pgworkerd_daemon;
REVOKE INSERT, UPDATE ON pgworkerd.job_logs FROM pgworkerd_daemon;
REVOKE UPDATE ON pgworkerd.attempts FROM pgworkerd_daemon;
REVOKE EXECUTE ON FUNCTION pgworkerd.schedule_declare(text, jsonb, text),
                           pgworkerd.schedule_fire(text, timestamptz, jsonb, text, text),
                           pgworkerd.prune_finished_v1(float8, float8, float8, integer)
       FROM pgworkerd_daemon;
REVOKE SELECT ON pgworkerd.jobs, pgworkerd.job_logs FROM pgworkerd_daemon;
DO $$
DECLARE
    t text;
    readable text;
BEGIN
    FOREACH t IN ARRAY ARRAY['pgworkerd.jobs', 'pgworkerd.job_logs'] LOOP
        SELECT pg_catalog.string_agg(pg_catalog.quote_ident(a.attname), ', '
                                     ORDER BY a.attnum)
          INTO readable
          FROM pg_catalog.pg_attribute a
         WHERE a.attrelid = t::regclass AND a.attnum > 0 AND NOT a.attisdropped
           AND a.attname <> 'lease_token';
        EXECUTE pg_catalog.format('GRANT SELECT (%s) ON %s TO pgworkerd_daemon', readable, t);
    END LOOP;
END
$$;
-- A refused outcome is checked against the job's lease without reading the token
-- (schema 24).
GRANT EXECUTE ON FUNCTION pgworkerd.job_lease_state_v1(bigint, bigint) TO pgworkerd_daemon;
-- The registry (schema 24): a daemon writes its own row only, through these functions,
-- each naming the secret the row was registered with; heartbeat_at is the server's
-- clock; a login keeps at most registry_cap's rows not gone. No table rights to write.
REVOKE INSERT, UPDATE, DELETE ON pgworkerd.workers FROM pgworkerd_daemon;
GRANT SELECT ON pgworkerd.workers, pgworkerd.registry_cap TO pgworkerd_daemon;
GRANT EXECUTE ON FUNCTION pgworkerd.worker_register_v2(text, text, text, integer, text, text[],
                                                       text[], integer, text, jsonb, float8),
                          pgworkerd.worker_heartbeat_v2(text, text, text, bigint[], text[],
                                                        text[], integer, jsonb, float8),
                          pgworkerd.worker_deregister_v2(text, text),
                          pgworkerd.worker_schedules_set_v2(text, text, text[]),
                          pgworkerd.worker_mark_stale_v2(float8)
      TO pgworkerd_daemon;
-- The claim of every language (schema 19; README "Jobs"), and the finishing functions a
-- worker in another language calls as pgworkerd_daemon (SECURITY DEFINER since schema 22,
-- EXECUTE no longer PUBLIC's).
GRANT EXECUTE ON FUNCTION pgworkerd.claim_jobs(text, text[], text[], float8[], integer[],
                                               integer, integer[], jsonb, integer[],
                                               integer[]),
                          pgworkerd.renew_lease(bigint, text, bigint, float8, jsonb, jsonb),
                          pgworkerd.complete_job(bigint, text, bigint, jsonb, jsonb),
                          pgworkerd.fail_job(bigint, text, bigint, text, float8, float8,
                                             jsonb, jsonb),
                          pgworkerd.release_job(bigint, text, bigint, jsonb, jsonb),
                          pgworkerd.snooze_job(bigint, text, bigint, float8, integer, jsonb,
                                               jsonb),
                          pgworkerd.give_up_job(bigint, text, bigint, text)
      TO pgworkerd_daemon;
-- The daemon's own statements (sql/queries/jobs.sql): batched renew and complete, cancel and
-- snooze of held jobs (schema 22), all fenced by the lease.
GRANT EXECUTE ON FUNCTION pgworkerd.renew_leases(text, bigint[], bigint[], float8[], jsonb[],
                                                 jsonb[]),
                          pgworkerd.complete_jobs(text, bigint[], bigint[], jsonb[], jsonb[]),
                          pgworkerd.cancel_held_job(bigint, text, bigint, text, jsonb),
                          pgworkerd.snooze_held_job(bigint, text, bigint, float8, integer,
                                                    jsonb, jsonb)
      TO pgworkerd_daemon;
-- Attempt history (schema 12): rows are written by a trigger (SECURITY DEFINER) whatever
-- ends an attempt; the daemon adds what it measured of its own attempts only
-- (attempt_account_v1), and `show` reads them.
GRANT SELECT ON pgworkerd.attempts TO pgworkerd_daemon;
GRANT EXECUTE ON FUNCTION pgworkerd.attempt_account_v1(text, bigint[], bigint[], float8[],
                                                       float8[], float8[], bigint[])
      TO pgworkerd_daemon;
-- Job logs (schema 15): the daemon writes what attempts it holds or held printed
-- (job_log_write_v1), never another worker's row; it reads them without their lease
-- tokens (above; `logs` is the reader's). Rows go with their job through a trigger
-- (SECURITY DEFINER).
GRANT EXECUTE ON FUNCTION pgworkerd.job_log_write_v1(text, bigint[], bigint[], integer[],
                                                     text[], text[], bigint[], bigint[],
                                                     boolean[])
      TO pgworkerd_daemon;
-- Pausing queues and handlers (`pgworkerd pause`/`resume --queue/--handler`, the claim
-- and `status` read what is paused; the functions are SECURITY DEFINER).
GRANT SELECT ON pgworkerd.paused TO pgworkerd_daemon;
GRANT EXECUTE ON FUNCTION pgworkerd.pause(text, text, text), pgworkerd.resume(text, text),
                          pgworkerd.pause_queue(text, text), pgworkerd.resume_queue(text),
                          pgworkerd.pause_handler(text, text), pgworkerd.resume_handler(text)
      TO pgworkerd_daemon;
-- Drains (`pgworkerd drain [--hand-back]`, `resume`, the dashboard's drain buttons): the
-- SECURITY DEFINER functions check every argument and change only the drain columns of
-- live daemons (schema 17).
GRANT EXECUTE ON FUNCTION pgworkerd.drain_request(text, text, boolean, interval, text[], text[]),
                          pgworkerd.drain_lift(text, text)
      TO pgworkerd_daemon;
-- Periodic jobs: an operator declares them (`pgworkerd schedules declare`); daemons read
-- them and fire ticks by name, the job built from the stored definition (schema 22).
GRANT SELECT ON pgworkerd.schedules, pgworkerd.schedule_runs TO pgworkerd_daemon;
GRANT EXECUTE ON FUNCTION pgworkerd.schedule_fire_v2(text, timestamptz, text)
      TO pgworkerd_daemon;
-- Durable waits (schema 28): a handler's WaitFor is the fenced job_suspend; the fleet
-- moves suspended jobs past their timeout back to pending (job_waits_expire, SECURITY
-- DEFINER: it changes nothing else); the daemon reads the signals its claimed jobs
-- received, and cannot write one (no INSERT on signals, no EXECUTE on signal_send): a
-- worker host cannot forge an approval.
GRANT SELECT ON pgworkerd.signals TO pgworkerd_daemon;
GRANT EXECUTE ON FUNCTION pgworkerd.job_suspend(bigint, text, bigint, text, float8, text, jsonb,
                                                jsonb),
                          pgworkerd.job_waits_expire(integer)
      TO pgworkerd_daemon;
-- Retention (schemas 14, 20, 22): the fleet deletes finished jobs past their retention
-- through this SECURITY DEFINER function, which refuses the daemon role a retention
-- below the floor an operator set (retention_floor, 1 day until changed); the daemon has
-- no DELETE on jobs.
GRANT SELECT ON pgworkerd.retention_floor TO pgworkerd_daemon;
-- Deadlines (schema 32): the fleet ends jobs past their expires_at (job_expired_cancel,
-- SECURITY DEFINER: those jobs only, as cancelled "expired: ..."), served or not.
GRANT EXECUTE ON FUNCTION pgworkerd.job_expired_cancel(integer) TO pgworkerd_daemon;
GRANT EXECUTE ON FUNCTION pgworkerd.prune_finished_v2(float8, float8, float8, float8, float8,
                                                      integer)
      TO pgworkerd_daemon;

-- pgworkerd_enqueuer: enqueue, and read its own jobs.
GRANT USAGE ON SCHEMA pgworkerd TO pgworkerd_enqueuer;
GRANT EXECUTE ON FUNCTION pgworkerd.enqueue(text, jsonb, text, integer, timestamptz,
                                            interval, integer, text),
                          pgworkerd.enqueue_many(jsonb)
      TO pgworkerd_enqueuer;
-- with concurrency keys (0009)
GRANT EXECUTE ON FUNCTION pgworkerd.enqueue_v2(text, jsonb, text, integer, timestamptz,
                                               interval, integer, text, text),
                          pgworkerd.enqueue_many_v2(jsonb)
      TO pgworkerd_enqueuer;
-- signals (schema 28): to the jobs its login enqueued (signal_send checks job_get_v1's
-- rule), by id or correlation key; first write wins, a finished job takes none.
GRANT EXECUTE ON FUNCTION pgworkerd.signal_send(bigint, text, jsonb),
                          pgworkerd.signal_send_by_key(text, text, jsonb)
      TO pgworkerd_enqueuer;
-- by key before any job waits with it (schema 32): parked under the key for the next
-- job of a login the sender may read that waits with it (bounded; 7 days)
GRANT EXECUTE ON FUNCTION pgworkerd.signal_send_by_key_v2(text, text, jsonb)
      TO pgworkerd_enqueuer;
-- (the enqueuer also needs to read the schema version for `pgworkerd enqueue`'s check)
GRANT SELECT ON pgworkerd.schema_version TO pgworkerd_enqueuer;

-- Its own jobs (0018): pgworkerd.get and wait read through job_get_v1 (SECURITY DEFINER,
-- EXECUTE for every role with USAGE on the schema), which returns a job to the login that
-- enqueued it (jobs.enqueued_by) and to roles that may SELECT the table: nothing to grant.

-- pgworkerd_reader: reads, changes nothing.
GRANT USAGE ON SCHEMA pgworkerd TO pgworkerd_reader;
GRANT SELECT ON pgworkerd.schema_version, pgworkerd.jobs, pgworkerd.attempts,
                pgworkerd.job_logs, pgworkerd.workers, pgworkerd.paused,
                pgworkerd.schedules, pgworkerd.schedule_runs, pgworkerd.retention_floor
      TO pgworkerd_reader;
-- what enqueuers may ask (schema 23); how many daemons a login may register (schema 24)
GRANT SELECT ON pgworkerd.enqueue_bounds, pgworkerd.registry_cap TO pgworkerd_reader;
-- the signals jobs received (schema 28)
GRANT SELECT ON pgworkerd.signals TO pgworkerd_reader;

-- pgworkerd_operator: what the reader reads and the enqueuer runs (memberships, so a
-- release's new grants to either reach the operator too), and the actions below.
GRANT USAGE ON SCHEMA pgworkerd TO pgworkerd_operator;
GRANT pgworkerd_reader, pgworkerd_enqueuer TO pgworkerd_operator;
-- cancel and retry (job_cancel, job_retry in sql/queries/jobs.sql; retry resets snoozes since
-- schema 20): only the columns they write, never payload, handler, queue, priority,
-- checkpoint or dedupe_key.
GRANT UPDATE (status, attempts, snoozes, run_at, finished_at, cancel_requested, updated_at)
      ON pgworkerd.jobs TO pgworkerd_operator;
-- pause/resume of queues and handlers (SECURITY DEFINER functions).
GRANT EXECUTE ON FUNCTION pgworkerd.pause(text, text, text), pgworkerd.resume(text, text),
                          pgworkerd.pause_queue(text, text), pgworkerd.resume_queue(text),
                          pgworkerd.pause_handler(text, text), pgworkerd.resume_handler(text)
      TO pgworkerd_operator;
-- drain (plain and --hand-back) and resume of daemons: the SECURITY DEFINER functions of
-- schema 17, which check every argument and change only the drain columns of live daemons.
GRANT EXECUTE ON FUNCTION pgworkerd.drain_request(text, text, boolean, interval, text[], text[]),
                          pgworkerd.drain_lift(text, text)
      TO pgworkerd_operator;
-- prune: `pgworkerd prune` deletes finished jobs at any retention (their attempts and
-- logs go with them through SECURITY DEFINER triggers), the registry rows of daemons long
-- gone, and old schedule runs, through the fleet's retention function (prune_finished_v2,
-- the daemons' statement; with DELETE on jobs no floor applies). (DELETE itself reaches
-- any row: operators are trusted with the table's rows, never with what a job runs.
-- schedule_runs_prune: what `prune` of older releases calls.)
GRANT DELETE ON pgworkerd.jobs, pgworkerd.workers TO pgworkerd_operator;
GRANT EXECUTE ON FUNCTION pgworkerd.prune_finished_v2(float8, float8, float8, float8, float8,
                                                      integer),
                          pgworkerd.schedule_runs_prune(interval)
      TO pgworkerd_operator;
-- enqueue bounds (schema 23): what enqueuers may ask, per role and queue. Only the bound
-- itself: set_by and set_at are the table's defaults (who set it, when), never given.
GRANT INSERT (role_name, queue, priority_min, priority_max, dedupe_key_prefix,
              concurrency_key_prefix, comment),
      UPDATE (role_name, queue, priority_min, priority_max, dedupe_key_prefix,
              concurrency_key_prefix, comment),
      DELETE
      ON pgworkerd.enqueue_bounds TO pgworkerd_operator;
-- schedules: `pgworkerd schedules declare` records the definitions of a daemon's config,
-- which daemons then fire (schema 22); the floor under the fleet's retention
-- (retention_floor_set; the operator's own prune is not held to it).
GRANT EXECUTE ON FUNCTION pgworkerd.schedule_declare(text, jsonb, text),
                          pgworkerd.retention_floor_set(float8)
      TO pgworkerd_operator;
-- the most daemons one login may keep registered and not gone (schema 24; 100 until set)
GRANT UPDATE (max_live_per_login) ON pgworkerd.registry_cap TO pgworkerd_operator;
-- the dashboard's bulk actions (schema 36): the priority of a selection of at most 1000
-- pending, waiting or suspended jobs (a SECURITY DEFINER function: UPDATE (priority) is
-- not granted, so the other columns of a job stay out of reach).
GRANT EXECUTE ON FUNCTION pgworkerd.job_priority_set(bigint[], integer) TO pgworkerd_operator;
-- the dashboard's bulk actions (schema 36): the priority of a selection of at most 1000
-- pending, waiting or suspended jobs (a SECURITY DEFINER function: UPDATE (priority) is
-- not granted, so the other columns of a job stay out of reach).
GRANT EXECUTE ON FUNCTION pgworkerd.job_priority_set(bigint[], integer) TO pgworkerd_operator;
-- MERGE (issue 21): grants of people's roles for objects that later work adds go here,
-- with their statements in tests/integration/test_people_roles.py (STATEMENTS, PROMISED).
-- a handler's default dedupe policy (schema 37): set by the operator through a SECURITY
-- DEFINER function that checks every value (no INSERT or UPDATE on the table), read by
-- the reader (and so the operator); enqueuers need nothing (enqueue_many_v3 reads it).
GRANT SELECT ON pgworkerd.handler_defaults TO pgworkerd_reader;
GRANT EXECUTE ON FUNCTION pgworkerd.handler_default_set(text, text, interval, interval)
      TO pgworkerd_operator;

-- Dependencies and deadlines (schema 27, issue 24; docs/guide/dependencies.md).
-- enqueuer: enqueue with "after" (parents it may read: its own login's jobs), deadlines
-- and a per-job timeout, through the SECURITY DEFINER successors of enqueue.
GRANT EXECUTE ON FUNCTION pgworkerd.enqueue_v3(text, jsonb, text, integer, timestamptz,
                                               interval, integer, text, text, bigint[], text,
                                               timestamptz, interval, interval),
                          pgworkerd.enqueue_many_v3(jsonb)
      TO pgworkerd_enqueuer;
-- daemon: the claim that ends expired jobs and returns a job's own timeout and its
-- parents' results (SECURITY DEFINER: no right on job_parents needed).
GRANT EXECUTE ON FUNCTION pgworkerd.claim_jobs_v2(text, text[], text[], float8[], integer[],
                                                  integer, integer[], jsonb, integer[],
                                                  integer[])
      TO pgworkerd_daemon;
-- reader (and so operator): a job's parents and children (show, explain, the dashboard).
GRANT SELECT ON pgworkerd.job_parents TO pgworkerd_reader;
-- operator: release a job held for an operator after a parent failed.
GRANT EXECUTE ON FUNCTION pgworkerd.job_held_release(bigint) TO pgworkerd_operator;

-- Follow-ups and the lease in the handler's hands (schema 29, docs/guide/follow-ups.md,
-- docs/guide/exactly-once.md). The daemon completes a job it holds with the follow-up
-- jobs its handler returned, in one transaction, through these fenced SECURITY DEFINER
-- functions: a holder whose lease was lost inserts nothing, and a role that holds no job
-- can enqueue no follow-up (they are no enqueue right: each list goes through
-- enqueue_many_v3's checks and the bounds of the daemon's login).
GRANT EXECUTE ON FUNCTION pgworkerd.jobs_complete_with_follow_ups(text, bigint[], bigint[],
                                                                  jsonb[], jsonb[], jsonb[]),
                          pgworkerd.job_complete_with_follow_ups(bigint, text, bigint, jsonb,
                                                                 jsonb, jsonb)
      TO pgworkerd_daemon;
-- An application's own connection (the enqueuer's login, or its own login member of it)
-- makes its writes conditional on a job's lease: job_lease_assert takes the job's id and
-- the token its handler was given (a capability: without it the call refuses, and it
-- reveals no token). It holds the job's row FOR KEY SHARE to the end of the caller's
-- transaction: a rescue waits that long.
GRANT EXECUTE ON FUNCTION pgworkerd.job_lease_assert(bigint, bigint) TO pgworkerd_enqueuer;
-- which jobs a completion inserted (`show`, the dashboard)
GRANT SELECT ON pgworkerd.job_follow_ups TO pgworkerd_reader;

-- Batches (schema 30, docs/guide/batches.md). enqueuer: enqueue a batch (its members and
-- its callback, in one transaction, through enqueue_many_v3's checks and the login's
-- bounds), and page the members' outcomes of a batch whose callback it enqueued.
GRANT EXECUTE ON FUNCTION pgworkerd.batch_enqueue(jsonb, jsonb),
                          pgworkerd.batch_members_page(bigint, bigint, integer)
      TO pgworkerd_enqueuer;
-- daemon: a callback's batch and its members' outcomes, read before the callback starts;
-- reader (and so operator): a batch's progress (show, explain, the dashboard).
GRANT SELECT ON pgworkerd.batches TO pgworkerd_daemon, pgworkerd_reader;

-- Batches (schema 30, docs/guide/batches.md). enqueuer: enqueue a batch (its members and
-- its callback, in one transaction, through enqueue_many_v3's checks and the login's
-- bounds), and page the members' outcomes of a batch whose callback it enqueued.
GRANT EXECUTE ON FUNCTION pgworkerd.batch_enqueue(jsonb, jsonb),
                          pgworkerd.batch_members_page(bigint, bigint, integer)
      TO pgworkerd_enqueuer;
-- daemon: a callback's batch and its members' outcomes, read before the callback starts;
-- reader (and so operator): a batch's progress (show, explain, the dashboard).
GRANT SELECT ON pgworkerd.batches TO pgworkerd_daemon, pgworkerd_reader;

-- The daemon's claim from schema 31 (claim_jobs_v3, docs/reference/sql-api.md): also
-- returns what woke a job and a batch callback's batch (SECURITY DEFINER: it reads signals
-- and batches with its owner's rights).
GRANT EXECUTE ON FUNCTION pgworkerd.claim_jobs_v3(text, text[], integer, jsonb)
      TO pgworkerd_daemon;

-- Fair share and start-rate limits (schema 33, docs/guide/limits.md): claim_jobs_v3
-- writes the buckets and cursors with its owner's rights. daemon: when the next token
-- is due (it wakes then); reader (and so operator): explain (a job's turn, the next
-- token) and the dashboard's Limits page.
GRANT SELECT ON pgworkerd.rate_buckets, pgworkerd.fair_cursors
      TO pgworkerd_daemon, pgworkerd_reader;


-- Behind PgBouncer in transaction mode, startup options are not passed on: set the
-- statement timeout on the role instead (and `statement_timeout = "0s"` in the config).
ALTER ROLE pgworkerd_daemon SET statement_timeout = '10s';
-- Bounds what one enqueue call may cost the server (a million-job enqueue_many runs ~15 s).
ALTER ROLE pgworkerd_enqueuer SET statement_timeout = '30s';
-- pgworkerd sets this search_path as a startup option too (PgBouncer drops it): functions
-- and operators resolve in pg_catalog only, so nothing planted in `public` or another
-- schema can stand in for a built-in in the daemon's statements. The SQL functions pin
-- it themselves. (An application that also uses pgworkerd_enqueuer for its own tables
-- must then schema-qualify them, or leave out the enqueuer's line.)
ALTER ROLE pgworkerd_daemon SET search_path = pg_catalog, pg_temp;
ALTER ROLE pgworkerd_enqueuer SET search_path = pg_catalog, pg_temp;
ALTER ROLE pgworkerd_operator SET search_path = pg_catalog, pg_temp;
ALTER ROLE pgworkerd_reader SET search_path = pg_catalog, pg_temp;

-- Dedupe windows and policies (schema 34, docs/guide/enqueue.md "Dedupe"). enqueuer: one
-- job with a dedupe window or policy (enqueue_many_v3 takes them in its job objects).
GRANT EXECUTE ON FUNCTION pgworkerd.enqueue_v4(text, jsonb, text, integer, timestamptz,
                                               interval, integer, text, text, bigint[], text,
                                               timestamptz, interval, interval, interval,
                                               text, interval, interval)
      TO pgworkerd_enqueuer;

-- Dedupe windows and policies (schema 34, docs/guide/enqueue.md "Dedupe"). enqueuer: one
-- job with a dedupe window or policy (enqueue_many_v3 takes them in its job objects).
GRANT EXECUTE ON FUNCTION pgworkerd.enqueue_v4(text, jsonb, text, integer, timestamptz,
                                               interval, integer, text, text, bigint[], text,
                                               timestamptz, interval, interval, interval,
                                               text, interval, interval)
      TO pgworkerd_enqueuer;

-- The charts' rollup (schema 38): the fleet counts ended attempts per handler and time
-- bucket (attempt_rollups_advance, SECURITY DEFINER: it writes only the rollup and its
-- cursor, from the attempts); the reader (and so the operator, the dashboard) reads them.
GRANT EXECUTE ON FUNCTION pgworkerd.attempt_rollups_advance(integer, float8) TO pgworkerd_daemon;
GRANT SELECT ON pgworkerd.attempt_rollups, pgworkerd.attempt_rollup_cursor TO pgworkerd_reader;
-- A pause that names the person who asked (schema 38; `pgworkerd pause --reason --by`,
-- the dashboard's pause): as pause() (the operator's, and the daemon role's as before).
GRANT EXECUTE ON FUNCTION pgworkerd.paused_add(text, text, text, text)
      TO pgworkerd_operator, pgworkerd_daemon;

-- Wake-ups aimed at daemons (schema 40): a daemon says in its own row that it listens on
-- its own channel, and hands a wake-up it cannot take on to the next daemons chosen for
-- it (workers_wake, SECURITY DEFINER: it reads the registry; the trigger of new jobs calls
-- it for whatever role inserted them).
GRANT EXECUTE ON FUNCTION pgworkerd.worker_wake_channel_set(text, text, boolean),
                          pgworkerd.workers_wake(text, text, bigint, bigint, integer, integer)
      TO pgworkerd_daemon;

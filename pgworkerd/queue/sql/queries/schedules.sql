-- Statements on periodic jobs (sql/objects/schedules.sql).
--
-- Each statement under a "-- name:" header with a one-line description; queue/queries.py
-- loads every file of this folder into one registry (a name is defined once, in the file
-- of its entity: docs/development/sql.md). @schema@ is replaced by the quoted schema
-- name, @schema_literal@ by it as a string literal and @notify_channel@ (and the other
-- @..._channel@) by the quoted name of a channel; parameters are psycopg's %(name)s
-- placeholders (so a literal percent sign is written %%).

-- name: schedule_declare
-- Record this daemon's definition of a schedule; returns the tick up to which the schedule
-- is handled (its latest run, or when it was first declared).
SELECT @schema@.schedule_declare(%(name)s, %(definition)s::jsonb, %(worker)s) AS handled_until;

-- name: schedule_declared
-- Whether this role may declare schedules (an operator; the daemon role may not since
-- schema 22), and the stored definition of one (NULL: not declared) with the tick up to
-- which it is handled (its latest run, or when it was first declared).
SELECT has_function_privilege(@schema_literal@ || '.schedule_declare(text, jsonb, text)',
                              'EXECUTE') AS may_declare,
       s.definition,
       greatest(s.created_at, (SELECT max(r.tick) FROM @schema@.schedule_runs r
                                WHERE r.schedule = s.name)) AS handled_until
  FROM (SELECT) AS one
  LEFT JOIN @schema@.schedules s ON s.name = %(name)s;

-- name: schedule_fire
-- Fire one tick of a schedule an operator declared, its job and overlap policy taken from
-- the stored definition (migration 0022, schedule_fire_v2): record it and enqueue its job
-- in one transaction; returns outcome fired / skipped / taken and the job id.
SELECT outcome, job_id
  FROM @schema@.schedule_fire_v2(%(name)s, %(tick)s, %(worker)s);

-- name: schedule_list
-- Every schedule with its last run, that run's job status, and whether a live daemon
-- declares it now (its name among a live daemon's schedules).
SELECT s.name, s.definition, s.declared_by, s.declared_at, s.created_at,
       r.tick AS last_tick, r.job_id AS last_job_id, r.skipped AS last_skipped,
       r.fired_by AS last_fired_by, j.status::text AS last_job_status,
       (SELECT count(*) FROM @schema@.schedule_runs c WHERE c.schedule = s.name) AS runs,
       EXISTS (SELECT 1 FROM @schema@.workers w
                WHERE w.state <> 'gone' AND w.schedules @> ARRAY[s.name]) AS declared_now
  FROM @schema@.schedules s
  LEFT JOIN LATERAL (SELECT * FROM @schema@.schedule_runs r
                      WHERE r.schedule = s.name ORDER BY r.tick DESC LIMIT 1) r ON true
  LEFT JOIN @schema@.jobs j ON j.id = r.job_id
 ORDER BY s.name;

-- name: schedule_trigger
-- Enqueue the job of schedule %(name)s now, as its ticks would (handler, payload, queue,
-- priority, max_attempts as declared), through enqueue_v3 and its checks (a hostile
-- definition is refused with 22023); records no run, so the schedule's ticks are
-- unchanged (the dashboard's "trigger now"). No row: no such schedule.
SELECT @schema@.enqueue_v3(
           handler => s.definition ->> 'handler',
           payload => coalesce(s.definition -> 'payload', '{}'::jsonb),
           queue => coalesce(s.definition ->> 'queue', 'default'),
           priority => coalesce((s.definition ->> 'priority')::integer, 0),
           max_attempts => coalesce((s.definition ->> 'max_attempts')::integer, 5)) AS id
  FROM @schema@.schedules s
 WHERE s.name = %(name)s;

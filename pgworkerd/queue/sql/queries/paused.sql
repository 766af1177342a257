-- Statements on paused queues and handlers (migration 0009, sql/objects/paused.sql).
--
-- Each statement under a "-- name:" header with a one-line description; queue/queries.py
-- loads every file of this folder into one registry (a name is defined once, in the file
-- of its entity: docs/development/sql.md). @schema@ is replaced by the quoted schema
-- name, @schema_literal@ by it as a string literal and @notify_channel@ (and the other
-- @..._channel@) by the quoted name of a channel; parameters are psycopg's %(name)s
-- placeholders (so a literal percent sign is written %%).

-- name: paused_set
-- Pause (%(pause)s true) or resume a queue or handler; true when that changed something.
-- A pause that names who asked (%(requested_by)s not NULL) goes through paused_add (0038),
-- with %(comment)s as its reason. A resume also wakes the daemons of schema 13 on
-- (resume() notifies the old channel).
SELECT c.changed FROM (
    SELECT CASE WHEN NOT %(pause)s THEN @schema@.resume(%(kind)s, %(name)s)
                WHEN %(requested_by)s::text IS NULL
                THEN @schema@.pause(%(kind)s, %(name)s, %(comment)s)
                ELSE @schema@.paused_add(%(kind)s, %(name)s, %(comment)s,
                                         %(requested_by)s::text) END AS changed) c
  LEFT JOIN LATERAL (
    SELECT pg_notify(@schema_literal@ || '.wake', '{}') WHERE c.changed AND NOT %(pause)s
  ) AS sent ON true;

-- name: paused_target_served
-- Whether a live daemon serves queue or handler %(name)s (%(kind)s): `pause` warns about
-- a name none does (a typo pauses nothing anyone runs, and says so).
SELECT EXISTS (SELECT 1 FROM @schema@.workers w
                WHERE w.state <> 'gone'
                  AND CASE WHEN %(kind)s = 'queue' THEN w.queues ELSE w.handlers END
                      @> ARRAY[%(name)s::text]) AS served;

-- name: paused_list
-- What is paused, oldest first, as `status` shows it.
-- requested_by: the person who asked (0038; NULL: paused through pause(), by the role).
SELECT kind, name, paused_at, paused_by, comment, requested_by,
       extract(epoch FROM now() - paused_at)::float8 AS paused_seconds
FROM @schema@.paused ORDER BY paused_at, kind, name;

-- Statements on handlers' default dedupe policies (migration 0037,
-- sql/objects/handler_defaults.sql).
--
-- Each statement under a "-- name:" header with a one-line description; queue/queries.py
-- loads every file of this folder into one registry (a name is defined once, in the file
-- of its entity: docs/development/sql.md). @schema@ is replaced by the quoted schema
-- name, @schema_literal@ by it as a string literal and @notify_channel@ (and the other
-- @..._channel@) by the quoted name of a channel; parameters are psycopg's %(name)s
-- placeholders (so a literal percent sign is written %%).

-- name: handler_default_set
-- Set (or with %(policy)s NULL remove) a handler's default dedupe policy; true when the
-- handler has one afterwards. The function checks every value (22023).
SELECT @schema@.handler_default_set(%(handler)s::text, %(policy)s::text,
                                    make_interval(secs => %(debounce)s::float8),
                                    make_interval(secs => %(debounce_max)s::float8));

-- name: handler_default_list
-- The handlers' default dedupe policies, by handler (all, or %(handler)s's).
SELECT handler, dedupe_policy, debounce_seconds, debounce_max_seconds, set_by, set_at
  FROM @schema@.handler_defaults
 WHERE %(handler)s::text IS NULL OR handler = %(handler)s::text
 ORDER BY handler;
